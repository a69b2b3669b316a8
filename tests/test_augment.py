"""Augmentation recipes (clharness.toolkit.augment): each op pinned on known images, every recipe's shape,
dtype, range and seeded determinism; the suite key; training views only for training data."""
import math

import pytest
import torch

import clharness as clh
from clharness.toolkit import augment as A
from clharness.data import ArrayDataset, TensorData
from clharness.method import Experience
from clharness.engine.suites import SuiteError, load_suite

import plugin_methods


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def image(n=1, c=1, h=4, w=4):
    return torch.arange(n * c * h * w, dtype=torch.float32).view(n, c, h, w)


UNIT3 = A.Frame.unit(3)


# ------------------------------------------------------------------------------ ops on known images
def test_crop_at_translates_by_the_offset_and_fills_the_border_with_black():
    x, fill = image(), torch.full((1, 1, 1, 1), -7.0)
    down_right = A.crop_at(x, 1, fill, torch.tensor([0]), torch.tensor([0]))
    assert torch.equal(down_right[0, 0, 1:, 1:], x[0, 0, :3, :3])
    assert (down_right[0, 0, 0] == -7).all() and (down_right[0, 0, :, 0] == -7).all()
    up_left = A.crop_at(x, 1, fill, torch.tensor([2]), torch.tensor([2]))
    assert torch.equal(up_left[0, 0, :3, :3], x[0, 0, 1:, 1:])
    assert torch.equal(A.crop_at(x, 1, fill, torch.tensor([1]), torch.tensor([1])), x)   # centre = identity


def test_crop_with_flip_is_the_mirrored_crop_and_uint8_pads_with_black():
    x = image(n=2, c=2, h=5, w=5)
    top, left = torch.tensor([0, 3]), torch.tensor([2, 1])
    both = A.crop_at(x, 2, torch.full((1, 2, 1, 1), -1.0), top, left, flip=torch.tensor([True, False]))
    plain = A.crop_at(x, 2, torch.full((1, 2, 1, 1), -1.0), top, left)
    assert torch.equal(both[0], plain[0].flip(2)) and torch.equal(both[1], plain[1])
    pixels = A.crop_at(x.to(torch.uint8) + 1, 2, None, top, left)
    assert pixels.dtype == torch.uint8 and torch.equal(pixels.float() - 1, plain)


def test_cifar_on_uint8_pixels_equals_the_recipe_on_normalised_images():
    recipe, mean, std = A.CifarAugmentation(), torch.tensor([0.5, 0.4, 0.3]), torch.tensor([0.2, 0.25, 0.3])
    shift, scale = (-mean / std).view(1, 3, 1, 1), (1 / (255 * std)).view(1, 3, 1, 1)
    frame = A.Frame.normalised(mean, std)
    pixels = torch.randint(0, 256, (32, 3, 8, 8), dtype=torch.uint8, generator=gen(9))
    fused = recipe.train_pixels(pixels, shift, scale, frame, (8, 8), gen(4))
    assert torch.allclose(fused, recipe.train(torch.addcmul(shift, pixels, scale), frame, (8, 8), gen(4)), atol=1e-5)


def test_random_crop_is_one_of_the_padded_translations_and_moves_pixels():
    x = image(n=24, c=3, h=8, w=8) + 1
    out = A.random_crop(x, 4, torch.zeros(1, 3, 1, 1), gen())
    moved = 0
    for i in range(24):
        shifts = [(dy, dx) for dy in range(-4, 5) for dx in range(-4, 5)
                  if torch.equal(out[i], A.crop_at(x[i:i + 1], 4, torch.zeros(1, 3, 1, 1),
                                                   torch.tensor([4 - dy]), torch.tensor([4 - dx]))[0])]
        assert len(shifts) == 1
        moved += shifts[0] != (0, 0)
    assert moved > 18   # 80 of 81 offsets move the image


def test_random_flip_mirrors_exactly_some_images_and_leaves_the_others():
    x = image(n=32, c=2, h=3, w=5)
    out = A.random_flip(x, gen(1))
    flipped = [torch.equal(out[i], x[i].flip(2)) for i in range(32)]
    kept = [torch.equal(out[i], x[i]) for i in range(32)]
    assert all(f or k for f, k in zip(flipped, kept)) and 5 < sum(flipped) < 27


def test_brightness_is_a_blend_with_black_clipped_and_commutes_with_normalisation():
    p = torch.tensor([0.0, 0.4, 0.7]).view(1, 1, 1, 3).expand(1, 3, 1, 3).contiguous()
    out = A.brightness(p, UNIT3, torch.tensor([2.0]))
    assert torch.allclose(out[0, 0, 0], torch.tensor([0.0, 0.8, 1.0]))
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    frame = A.Frame.normalised(mean.flatten(), std.flatten())
    for f in (0.3, 1.2, 2.0):
        in_normalised = A.brightness((p - mean) / std, frame, torch.tensor([f]))
        assert torch.allclose(in_normalised, (A.brightness(p, UNIT3, torch.tensor([f])) - mean) / std, atol=1e-6)


def test_resized_crop_of_a_known_box_and_its_mirror():
    x = image(h=4, w=4)
    box = torch.tensor([[0.0, 2.0, 2.0, 2.0]])   # top 0, left 2, 2 x 2: the top-right block
    assert torch.equal(A.resized_crop(x, box, (2, 2)), x[:, :, 0:2, 2:4])
    assert torch.equal(A.resized_crop(x, box, (2, 2), flip=torch.tensor([True])), x[:, :, 0:2, 2:4].flip(3))
    whole = A.resized_crop(x, torch.tensor([[0.0, 0.0, 4.0, 4.0]]), (8, 8))   # 2x upsampling of the whole image
    assert whole.shape == (1, 1, 8, 8) and whole.min() >= 0 and whole.max() <= 15


def test_resized_crop_boxes_follow_torchvision_ranges_and_the_seed():
    boxes = A.resized_crop_boxes(500, 32, 48, (0.08, 1.0), (3 / 4, 4 / 3), gen(2))
    top, left, h, w = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 32).all() and (left + w <= 48).all()
    area = h * w / (32 * 48)
    assert area.min() > 0.05 and area.max() <= 1.0 and (w / h).min() > 0.7 and (w / h).max() < 1.4
    assert (boxes == boxes.round()).all() and len(set(map(tuple, boxes.tolist()))) > 400
    assert torch.equal(boxes, A.resized_crop_boxes(500, 32, 48, (0.08, 1.0), (3 / 4, 4 / 3), gen(2)))
    # no valid try (scale > 1 everywhere): torchvision's fallback, the whole image's centred crop
    fallback = A.resized_crop_boxes(3, 10, 40, (1.5, 2.0), (3 / 4, 4 / 3), gen(0))
    assert fallback.tolist() == [[0.0, 13.0, 10.0, 13.0]] * 3


def test_eval_view_is_the_centred_crop_of_resize_256_crop_224():
    x = image(h=8, w=8)
    assert torch.equal(A.centre_crop_resize(x, 0.5, (4, 4), A.Frame.unit(1)), x[:, :, 2:6, 2:6])
    big = torch.rand(2, 3, 64, 64)
    out = A.ViTAugmentation().eval(big, UNIT3, (224, 224))
    assert out.shape == (2, 3, 224, 224) and 0 <= out.min() and out.max() <= 1   # bicubic clipped to the frame


# ------------------------------------------------------------------------------ every recipe
@pytest.mark.parametrize("name", ["cifar", "imagenet", "vit"])
def test_recipe_shapes_dtype_range_and_seeded_determinism(name):
    recipe = A.BUILTIN_RECIPES[name]
    mean, std = [0.5, 0.45, 0.4], [0.25, 0.25, 0.3]
    frame = A.Frame.normalised(mean, std)
    size = (32, 32) if name == "cifar" else (48, 48)
    pixels = torch.rand(16, 3, 32, 32)
    x = (pixels - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    a = recipe.train(x, frame, size, gen(5))
    assert a.shape == (16, 3, *size) and a.dtype == torch.float32
    assert (a >= frame.black - 1e-5).all() and (a <= frame.white + 1e-5).all()
    assert torch.equal(a, recipe.train(x, frame, size, gen(5)))
    assert not torch.equal(a, recipe.train(x, frame, size, gen(6)))
    assert recipe.active and recipe.source and recipe.__doc__


def test_none_is_the_identity_and_draws_nothing():
    g = gen(3)
    state = g.get_state()
    x = torch.randn(4, 3, 8, 8)
    assert A.BUILTIN_RECIPES["none"].train(x, UNIT3, (8, 8), g) is x
    assert torch.equal(g.get_state(), state) and A.get("none") is None


# ------------------------------------------------------------------------------ the suite key
def test_suite_key_names_a_registered_recipe(tmp_path):
    path = tmp_path / "s.toml"
    body = '[suite]\nname = "s"\n[[scenario]]\nname = "a"\ndataset = "digits"\ntasks = 5\naugment = "{}"\n'
    path.write_text(body.format("cifar"))
    assert load_suite(path).scenarios[0].augment == "cifar"
    path.write_text(body.format("autoaugment"))
    with pytest.raises(SuiteError, match="augment = 'autoaugment' is not a registered augmentation recipe; "
                                         "registered: cifar, imagenet, none, strong, vit"):
        load_suite(path)


def test_a_plugin_adds_a_recipe_through_the_hook(tmp_path):
    class Invert(A.Recipe):
        name = "invert"
        source = "test"

        def train(self, x, frame, size, generator):
            return frame.black + frame.white - x

    class Plugin:
        @clh.hookimpl
        def clharness_add_augmentations(self, registry):
            registry.add(Invert())

    try:
        harness = clh.Harness(plugins=(Plugin(),))
        assert "invert" in harness.augmentations and harness.augmentations.entry("invert").source != "clharness.builtin"
        path = tmp_path / "s.toml"
        path.write_text('[suite]\nname = "s"\n[[scenario]]\nname = "a"\ndataset = "digits"\ntasks = 5\n'
                        'augment = "invert"\n')
        assert load_suite(path).scenarios[0].augment == "invert"
    finally:
        clh.Harness()._build()   # back to the built-in recipes for the other tests


def test_first_task_train_is_checked(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[suite]\nname = "s"\n[[scenario]]\nname = "a"\ndataset = "digits"\ntasks = 5\n'
                    'first_task_train = { epochs = 200, lr = 0.1 }\n')
    with pytest.raises(SuiteError, match="first_task_train needs exactly the keys epochs, lr, milestones"):
        load_suite(path)


# ------------------------------------------------------------------------------ where it applies
def tensor_data(recipe):
    torch.manual_seed(0)
    ds = ArrayDataset(torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8), torch.arange(40) % 4, list("abcd"))
    return TensorData(ds, [0.5] * 3, [0.25] * 3, recipe=recipe)


def test_experience_batches_are_augmented_raw_on_request_and_reproducible():
    data = tensor_data(A.get("cifar"))
    exp = Experience(data, (0, 1, 2, 3), None, batch_size=8, seed=4)
    raw = torch.cat([b.x for b in exp.batches(shuffle=False, augment=False)])
    assert torch.equal(raw, data.prepare(data.images))
    aug = torch.cat([b.x for b in exp.batches(shuffle=False)])
    assert aug.shape == raw.shape and not torch.equal(aug, raw)
    again = Experience(data, (0, 1, 2, 3), None, batch_size=8, seed=4)
    assert torch.equal(torch.cat([b.x for b in again.batches(shuffle=False)]), aug)
    assert not torch.equal(exp.augment(raw[:8]), raw[:8])
    # shuffling draws do not depend on the recipe: same label order with and without it
    plain = Experience(tensor_data(None), (0, 1, 2, 3), None, batch_size=8, seed=4)
    assert [b.y.tolist() for b in plain.batches()] == [b.y.tolist() for b in exp.batches()]
    assert torch.equal(plain.augment(raw), raw) and not plain.augmenting


def test_resizing_recipe_trains_from_native_size_and_tests_on_the_centre_view():
    data = tensor_data(A.get("vit"))
    data.image_size = (24, 24)
    exp = Experience(data, (0, 1, 2, 3), None, batch_size=8, seed=0)
    batch = next(iter(exp.batches()))
    assert batch.x.shape == (8, 3, 24, 24)
    normalised = torch.addcmul(data._shift, data.images[:8], data._scale)
    assert torch.allclose(data.prepare(data.images[:8]),
                          A.centre_crop_resize(normalised, 224 / 256, (24, 24), data.frame, "bicubic"))


class Recorder(plugin_methods.Tiny):
    """Records what it trains on and every input predict() receives."""
    name = "aug-recorder"
    seen, trained, raw = [], [], []

    def learn(self, experience):
        self.trained.append(torch.cat([b.x for b in experience.batches(shuffle=False)]))
        self.raw.append(torch.cat([b.x for b in experience.batches(shuffle=False, augment=False)]))
        super().learn(experience)

    def predict(self, x, task_id=None):
        self.seen.append(x.clone())
        return super().predict(x, task_id)


def test_only_training_batches_are_augmented_never_test_data():
    from clharness.engine.runner import Case, run_case
    from clharness.engine.scenario import build_scenario
    from clharness.engine.suites import ScenarioSpec

    harness = clh.Harness()

    class Plugin:
        @clh.hookimpl
        def clharness_add_methods(self, registry):
            registry.add(Recorder)

    harness.register(Plugin())
    spec = ScenarioSpec(name="s", dataset="digits", tasks=2, num_classes=4, epochs=1, augment="cifar",
                        backbone_options={"hidden": 8, "layers": 1})
    for log in (Recorder.seen, Recorder.trained, Recorder.raw):
        log.clear()
    record = run_case(Case("t", spec, "aug-recorder", 0), harness, torch.device("cpu"))
    assert record.status == "passed", record.message
    scenario = build_scenario(spec, harness.datasets, 0, torch.device("cpu"))
    tests = [t.test.prepare(t.test.images) for t in scenario.tasks]
    # the first predict() is the contract check before training, on task 0's first training batch, raw
    assert torch.equal(Recorder.seen[0], Recorder.raw[0][:len(Recorder.seen[0])])
    evaluated = torch.cat(Recorder.seen[1:])
    assert torch.equal(evaluated, torch.cat(tests * 2))          # both rows of R: exact, unaugmented test images
    for task, trained, raw in zip(scenario.tasks, Recorder.trained, Recorder.raw):
        assert torch.equal(raw, task.train.prepare(task.train.images)) and not torch.equal(trained, raw)


def test_stf_streams_refuse_augmentation(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[suite]\nname = "s"\n[[scenario]]\nname = "a"\nkind = "stf"\ndataset = "digits"\n'
                    'setting = "online"\ntasks = 5\naugment = "cifar"\n')
    with pytest.raises(SuiteError, match="an stf stream trains without augmentation"):
        load_suite(path)


def test_builtin_recipes_cite_their_exact_parameters():
    assert (A.CifarAugmentation.padding, A.CifarAugmentation.brightness) == (4, 63 / 255)
    assert A.ImageNetAugmentation.scale == (0.08, 1.0) and A.ImageNetAugmentation.brightness == 63 / 255
    assert A.ViTAugmentation.scale == (0.05, 1.0) and A.ViTAugmentation.brightness == 0
    assert math.isclose(A.ViTAugmentation.eval_fraction, 224 / 256)


def test_er_stores_raw_views_and_augments_replayed_samples_like_fresh_ones():
    import clharness_methods.er as er_module
    from clharness.method import Context, Setting

    class CountingExperience(Experience):
        calls = []

        def augment(self, x):
            self.calls.append(len(x))
            return super().augment(x)

    data = tensor_data(A.get("cifar"))
    context = Context(Setting.CLASS_IL, 4, (3, 16, 16), memory_size=12, epochs=1,
                      backbone_factory=lambda: _Flat(3 * 16 * 16))
    method = er_module.ER(context)
    method.learn(CountingExperience(data, (0, 1), None, batch_size=8, seed=0))
    raw = data.prepare(data.images)
    stored, _ = method.buffer.tensors()
    assert len(stored) == 12 and all((raw == row).flatten(1).all(1).any() for row in stored)   # raw views only
    assert CountingExperience.calls == [8] * 5         # first task: each step's fresh batch, nothing to replay
    method.learn(CountingExperience(data, (2, 3), None, batch_size=8, seed=1))
    # then each step's fresh and replayed samples in one view: 5 steps of 8 + 8 (40 images / 8)
    assert CountingExperience.calls == [8] * 5 + [16] * 5


class _Flat(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.out_dim = dim

    def forward(self, x):
        return x.flatten(1)
