"""The ``strong`` recipe (SimCLR-style views, mammoth's strong_aug for X-DER) and its colour ops:
shape, dtype, range, seeded determinism, and each colour op on known images."""
import colorsys

import pytest
import torch

from clharness.toolkit import augment as A

MEAN, STD = [0.5, 0.45, 0.4], [0.25, 0.25, 0.3]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def normalised(pixels, mean=MEAN, std=STD):
    c = pixels.shape[1]
    return (pixels - torch.tensor(mean[:c]).view(1, c, 1, 1)) / torch.tensor(std[:c]).view(1, c, 1, 1)


@pytest.mark.parametrize("channels", [3, 1])
def test_strong_shapes_dtype_range_and_seeded_determinism(channels):
    recipe = A.get("strong")
    frame = A.Frame.normalised(MEAN[:channels], STD[:channels])
    x = normalised(torch.rand(32, channels, 16, 16))
    a = recipe.train(x, frame, (16, 16), gen(5))
    assert a.shape == x.shape and a.dtype == torch.float32
    assert (a >= frame.black - 1e-5).all() and (a <= frame.white + 1e-5).all()
    assert torch.equal(a, recipe.train(x, frame, (16, 16), gen(5)))
    assert not torch.equal(a, recipe.train(x, frame, (16, 16), gen(6)))
    assert recipe.train(x, frame, (24, 20), gen(5)).shape == (32, channels, 24, 20)
    assert recipe.active and recipe.source and recipe.__doc__ and not recipe.resizes


def test_strong_views_of_the_same_image_differ_and_some_are_grey():
    x = normalised(torch.rand(1, 3, 16, 16)).expand(200, -1, -1, -1)
    frame = A.Frame.normalised(MEAN, STD)
    p = A.to_unit(A.get("strong").train(x, frame, (16, 16), gen(1)), frame)
    grey = (p.max(1).values - p.min(1).values).flatten(1).max(1).values < 1e-5
    assert 0.1 < grey.float().mean() < 0.3          # RandomGrayscale(0.2) over 200 views
    assert len({tuple(v.flatten().tolist()) for v in p}) == 200


def test_frame_round_trip():
    frame = A.Frame.normalised(MEAN, STD)
    pixels = torch.rand(2, 3, 4, 4)
    assert torch.allclose(A.to_unit(normalised(pixels), frame), pixels, atol=1e-6)
    assert torch.allclose(A.from_unit(pixels, frame), normalised(pixels), atol=1e-6)


def test_grayscale_makes_channels_equal_to_the_luma():
    p = torch.rand(4, 3, 5, 5)
    g = A.grayscale(p)
    assert torch.equal(g[:, 0], g[:, 1]) and torch.equal(g[:, 1], g[:, 2])
    assert torch.allclose(g[:, 0], 0.299 * p[:, 0] + 0.587 * p[:, 1] + 0.114 * p[:, 2])
    every = A.random_grayscale(p, 1.0, gen())
    assert torch.equal(every, g) and torch.equal(A.random_grayscale(p, 0.0, gen()), p)
    grey_input = torch.rand(4, 1, 5, 5)
    assert torch.equal(A.random_grayscale(grey_input, 1.0, gen()), grey_input)   # 1 channel: skipped


def pure(rgb, n=1):
    return torch.tensor(rgb, dtype=torch.float32).view(1, 3, 1, 1).expand(n, 3, 2, 2).clone()


def test_hue_shift_of_pure_colours_moves_them_as_hsv_says():
    red = pure((1.0, 0.0, 0.0))
    assert torch.allclose(A.adjust_hue(red, torch.tensor([1 / 3])), pure((0.0, 1.0, 0.0)), atol=1e-6)
    # hue 0 -> 0.1: sector 0, f = 0.6: (v, t, p) = (1, 0.6, 0)
    assert torch.allclose(A.adjust_hue(red, torch.tensor([0.1])), pure((1.0, 0.6, 0.0)), atol=1e-6)
    assert torch.allclose(A.adjust_hue(red, torch.tensor([-0.1])), pure((1.0, 0.0, 0.6)), atol=1e-6)
    # any colour, per-sample shifts: what colorsys (the standard library's HSV) gives
    colour = (0.8, 0.3, 0.5)
    shifts = torch.tensor([0.05, -0.08, 0.1])
    out = A.adjust_hue(pure(colour, 3), shifts)
    h, s, v = colorsys.rgb_to_hsv(*colour)
    for k, shift in enumerate(shifts.tolist()):
        expected = colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)
        assert torch.allclose(out[k, :, 0, 0], torch.tensor(expected), atol=1e-5)
    grey = pure((0.4, 0.4, 0.4))
    assert torch.allclose(A.adjust_hue(grey, torch.tensor([0.1])), grey)   # no hue to move


def test_hsv_round_trip():
    p = torch.rand(3, 3, 6, 6)
    assert torch.allclose(A.hsv_to_rgb(A.rgb_to_hsv(p)), p, atol=1e-5)


def test_brightness_contrast_saturation_blend_as_pil():
    p = torch.tensor([0.2, 0.4, 0.6]).view(1, 3, 1, 1).expand(2, 3, 1, 2).clone()
    p[1, :, :, 1] = 0.0
    assert torch.allclose(A.adjust_brightness(p, torch.tensor([1.5, 0.5])),
                          torch.stack([(p[0] * 1.5).clamp(0, 1), p[1] * 0.5]))
    luma = 0.299 * 0.2 + 0.587 * 0.4 + 0.114 * 0.6
    sat = A.adjust_saturation(p, torch.tensor([0.0, 1.0]))
    assert torch.allclose(sat[0], torch.full_like(sat[0], luma)) and torch.allclose(sat[1], p[1])
    con = A.adjust_contrast(p, torch.tensor([0.0, 2.0]))
    assert torch.allclose(con[0], torch.full_like(con[0], luma))       # contrast 0: the mean grey level
    mean1 = luma / 2                                                    # second image: half its pixels black
    assert torch.allclose(con[1], (2 * p[1] - mean1).clamp(0, 1))


def test_jitter_with_probability_zero_is_the_identity_and_one_channel_keeps_brightness_and_contrast():
    p = torch.rand(8, 3, 4, 4)
    assert torch.equal(A.random_color_jitter(p, 0.4, 0.4, 0.4, 0.1, 0.0, gen()), p)
    grey = torch.rand(64, 1, 4, 4)
    out = A.random_color_jitter(grey, 0.4, 0.4, 0.4, 0.1, 1.0, gen())
    assert out.shape == grey.shape and not torch.equal(out, grey) and 0 <= out.min() and out.max() <= 1


def test_jitter_applies_the_adjustments_in_a_random_order_per_image():
    # brightness and contrast do not commute (clipping, and contrast's mean moves with brightness):
    # every output is one of the two orders, with the factors drawn from the generator, and both occur.
    # A ramp up to white: a brightness factor > 1 clips its top pixels, so the two orders differ. The
    # image is fixed (not drawn from torch's global generator), and the match tolerance is float32
    # rounding of a batch-subset computation (about 1e-6), far below the orders' difference.
    p = torch.linspace(0, 1, 48).reshape(1, 3, 4, 4).expand(64, -1, -1, -1)
    out = A.random_color_jitter(p, 0.4, 0.4, 0.0, 0.0, 1.0, gen(2))
    g = gen(2)
    torch.rand(64, generator=g)                                 # the RandomApply draws
    u = torch.rand(4, 64, generator=g)
    fb, fc = 0.6 + 0.8 * u[0], 0.6 + 0.8 * u[1]
    b_then_c = A.adjust_contrast(A.adjust_brightness(p, fb), fc)
    c_then_b = A.adjust_brightness(A.adjust_contrast(p, fc), fb)
    first = (out - b_then_c).flatten(1).abs().max(1).values < 1e-5
    second = (out - c_then_b).flatten(1).abs().max(1).values < 1e-5
    assert (first | second).all() and (first & ~second).any() and (second & ~first).any()


def test_every_test_starts_from_seeded_global_generators(seeded):
    """tests/conftest.py seeds torch, numpy and random before each test: the first global draws are
    those of fresh generators seeded with the test seed, whatever ran before."""
    import random

    import numpy as np
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(seeded)))
    assert np.random.rand() == np.random.RandomState(seeded).rand()
    assert random.random() == random.Random(seeded).random()
