"""The method contract: what a continual-learning method author implements.

One page, on purpose::

    class MyMethod(clh.Method):
        name = "mine"
        settings = {clh.Setting.CLASS_IL, clh.Setting.TASK_IL}
        hparams = {"lr": clh.Float(1e-4, 1.0, default=0.1, log=True)}

        def __init__(self, context, **hp):
            super().__init__(context, **hp)          # validates hp into self.hp
            self.model = context.make_classifier()   # backbone + head over global class ids

        def learn(self, experience):                 # one offline task (train data only)
            opt = torch.optim.SGD(self.model.parameters(), lr=self.hp["lr"])
            for x, y in experience.batches(epochs=self.context.epochs):
                ...

        def predict(self, x, task_id=None):          # logits over all global class ids
            return self.model(x)

``observe(batch)`` receives one minibatch of a task-free stream; ``features(x)`` and
``memory_report()`` have working defaults for methods that keep their network in
``self.model``. ``snapshot()``/``restore()`` copy the whole state (tree search trains
copies and throws them away).
"""
from __future__ import annotations

import copy
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping

import torch
from torch import nn

from . import hparams as hp_space
from .hparams import Param


class Setting(str, enum.Enum):
    CLASS_IL = "class-incremental"   # task id hidden at train and test time
    TASK_IL = "task-incremental"     # task id given; logits masked to the task's classes
    ONLINE = "online"                # task-free stream, one minibatch at a time
    DOMAIN_IL = "domain-incremental"  # the same classes every task, under a changing input distribution

    def __str__(self) -> str:
        return self.value


class MethodError(RuntimeError):
    """A method misbehaved (raised, wrong shapes, non-finite outputs)."""


class Diverged(MethodError):
    """Training produced a non-finite loss, parameters or outputs."""


@dataclass
class Batch:
    """One minibatch of normalised float inputs on the run's device and global labels."""
    x: torch.Tensor
    y: torch.Tensor
    task_id: int | None = None

    def __iter__(self):  # allows ``x, y = batch``
        return iter((self.x, self.y))


@dataclass
class Experience:
    """One offline task: its training data and classes. Never holds test data."""
    data: Any                       # a clharness.data.TensorData / StreamData (train split only)
    classes: tuple[int, ...]        # global class ids of this task
    task_id: int | None             # None where the setting hides it (class-incremental)
    batch_size: int = 32
    seed: int = 0
    _aug_gen: torch.Generator | None = field(default=None, init=False, repr=False, compare=False)
    # set by the runner for continual evaluation: called after every training iteration (each minibatch
    # of a shuffled pass, counted when the method asks for the next one, i.e. after its step)
    on_step: Any = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def augmenting(self) -> bool:
        """Whether the suite's augmentation recipe (scenario key ``augment``) is on for this data."""
        return getattr(self.data, "recipe", None) is not None

    def _augment_generator(self) -> torch.Generator:
        # its own stream on the data's device, seeded by the run: shuffling draws are unchanged by it
        if self._aug_gen is None:
            device = getattr(self.data, "device", torch.device("cpu"))
            self._aug_gen = torch.Generator(device=device).manual_seed(self.seed * 7919 + 104729)
        return self._aug_gen

    def batches(self, batch_size: int | None = None, epochs: int = 1, shuffle: bool = True,
                generator: torch.Generator | None = None, augment: bool = True) -> Iterator[Batch]:
        """Minibatches over ``epochs`` passes, shuffled reproducibly per experience seed; training
        views under the suite's augmentation recipe unless ``augment=False`` (the raw view)."""
        if generator is None:
            generator = torch.Generator().manual_seed(self.seed)
        extra = {"augment": self._augment_generator()} if augment and self.augmenting else {}
        step = self.on_step if shuffle else None
        for _ in range(epochs):
            for x, y in self.data.batches(batch_size or self.batch_size, shuffle=shuffle, generator=generator,
                                          **extra):
                yield Batch(x, y, self.task_id)
                if step is not None:
                    step()

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """A random training view of any prepared batch ``x`` under the suite's recipe (replayed
        exemplars, a second view); ``x`` itself when the suite asks for no augmentation."""
        return self.data.augment(x, self._augment_generator()) if self.augmenting else x

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All train inputs (normalised, not augmented) and labels at once; fine for small datasets."""
        xs, ys = zip(*((b.x, b.y) for b in self.batches(batch_size=4096, shuffle=False, augment=False)))
        return torch.cat(xs), torch.cat(ys)


@dataclass
class Context:
    """What the harness tells a method about the run it is built for."""
    setting: Setting
    num_classes: int                      # size of the global label space
    input_shape: tuple[int, ...]          # (C, H, W) of one normalised input
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    epochs: int = 1                       # passes over each offline task
    batch_size: int = 32
    memory_size: int = 0                  # exemplar budget (images), 0 = no replay memory
    amp: bool = False                     # mixed precision allowed (CUDA runs)
    backbone_factory: Callable[[], nn.Module] | None = None
    task_classes: tuple[tuple[int, ...], ...] = ()  # filled for task-incremental only
    # The suite's fixed first-task training (GTEP Table 3), or None: keys epochs, lr, milestones,
    # lr_decay, weight_decay. Methods train their first task with it (clharness.toolkit.training does).
    first_task_train: Mapping[str, Any] | None = None
    # Digest of every tensor of the first backbone this context built, by its name in that backbone:
    # the encoder all methods of the run share, which the memory footprint leaves out (CLDyB B.4).
    shared_backbone: dict[str, str] | None = field(default=None, repr=False, compare=False)
    # how memory_report reads CLDyB B.4's "in addition to the ViT Encoder" (MEMORY_ENCODER_READINGS), and
    # whether the first backbone holds pretrained weights (else only a frozen_shared module is "the encoder":
    # a scratch run's untouched copy of its random init is a replica, not an encoder all methods share)
    memory_encoder: str = "trained"
    pretrained_encoder: bool = False

    def make_backbone(self) -> nn.Module:
        """A fresh feature extractor with an ``out_dim`` attribute, on the run's device. The first
        one built is recorded as the run's shared encoder (see :meth:`Method.memory_report`)."""
        if self.backbone_factory is None:
            raise MethodError("this context has no backbone factory; the suite must name a backbone")
        backbone = self.backbone_factory().to(self.device)
        if self.shared_backbone is None:
            self.shared_backbone = {name: tensor_digest(t) for name, t in backbone.state_dict(keep_vars=True).items()}
        return backbone

    def make_classifier(self) -> "Classifier":
        return Classifier(self.make_backbone(), self.num_classes).to(self.device)


class Classifier(nn.Module):
    """Backbone plus one linear head over the global label space."""

    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


MEMORY_ENCODER_READINGS = ("trained", "never")   # Method.memory_report's readings of CLDyB B.4


@dataclass
class MemoryReport:
    """Storage a method keeps, counted as CLDyB appendix B.4 does: every parameter and
    stored statistic as fp32, every stored exemplar as a uint8 image."""
    parameters: int = 0          # parameters of every model copy and module held
    tensor_elements: int = 0     # other stored statistics (fisher, means, ...), fp32
    exemplars: int = 0           # number of stored images
    exemplar_bytes: int = 0      # their size as uint8 images

    # The footprint in three parts (issue 41 item 2), each in MiB: ``model_mb`` the parameters (of every
    # network, replica, prompt and adapter held), ``buffer_mb`` the replay memory's images (uint8), and
    # ``other_mb`` every other stored tensor as fp32: module buffers (BatchNorm statistics), Fisher
    # diagonals, anchors, class means, a memory's stored logits or labels kept as separate tensors.
    @property
    def model_mb(self) -> float:
        return 4 * self.parameters / 2**20

    @property
    def buffer_mb(self) -> float:
        return self.exemplar_bytes / 2**20

    @property
    def other_mb(self) -> float:
        return 4 * self.tensor_elements / 2**20

    @property
    def mb(self) -> float:   # = model_mb + buffer_mb + other_mb, summed in integers (no rounding)
        return (4 * (self.parameters + self.tensor_elements) + self.exemplar_bytes) / 2**20


class Method:
    """Base class of every continual-learning method (see the module docstring)."""
    name: ClassVar[str] = ""
    settings: ClassVar[frozenset[Setting] | set[Setting]] = frozenset({Setting.CLASS_IL, Setting.TASK_IL})
    hparams: ClassVar[Mapping[str, Param]] = {}
    version: ClassVar[str] = "1"   # bump when results change, so stored runs are redone
    # Seed ensembles (--clh-ensemble, engine.ensemble): the class itself opts in with ``ensemble = True``
    # (a subclass opts in anew, then inherits its base's ensemble_* declarations); ``ensemble_state``: the
    # attributes its own ``loss`` reads per member; ``ensemble_steps``: {fit loss name: (prepare, loss, after)}
    # for a loss that draws at random; ``ensemble_solo_when(hp)``: why these hyperparameters run solo (None:
    # batched); ``ensemble_obstacle``: why its training cannot be batched (named when it runs solo).
    ensemble: ClassVar[bool] = False

    def __init__(self, context: Context, **hparams: Any):
        self.context = context
        self.hp = hp_space.resolve(f"method {self.name!r}", self.hparams, hparams)

    # --- the calls the runner makes ---
    def learn(self, experience: Experience) -> None:
        """Learn one offline task. Default: stream its batches through ``observe``."""
        for batch in experience.batches(epochs=self.context.epochs):
            self.observe(batch)

    def observe(self, batch: Batch) -> None:
        """Learn from one minibatch of a task-free stream."""
        raise MethodError(f"method {self.name!r} implements neither learn() nor observe(); "
                          "override at least one of them")

    def consolidate(self) -> None:
        """Called before every evaluation. Work that readies predictions (retraining on a memory, a
        closed-form solve) belongs here: it is timed as training, not evaluation. Default: none."""

    def predict(self, x: torch.Tensor, task_id: int | None = None) -> torch.Tensor:
        """Logits of shape (N, context.num_classes) over global class ids. Default: ``self.model`` in eval
        mode (BatchNorm's running statistics are not moved by test data), put back in its mode after."""
        model = getattr(self, "model", None)
        if model is None:
            raise MethodError(f"method {self.name!r} has no self.model; override predict()")
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            return model(x)
        finally:
            for module, training in modes:
                module.training = training

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate-layer features (CLDyB prototypes and k-NN)."""
        model = getattr(self, "model", None)
        if model is None or not hasattr(model, "features"):
            raise MethodError(f"method {self.name!r} keeps no self.model with features(); override features()")
        return model.features(x)

    def memory_report(self) -> MemoryReport:
        """Walk the method's attributes: modules, buffers and tensors, counted "in addition to the
        ViT Encoder" (CLDyB appendix B.4: "model replicas (such as old models and models updated
        using EMA), PET modules, dataset statistics, and samples from previous tasks").

        The encoder is the run's shared backbone (the first ``make_backbone()``, by tensor name and
        bytes): inside a module marked ``frozen_shared`` (the feature cache's ``FrozenFeatures``) always,
        anywhere else when ``context.pretrained_encoder`` (the runner sets it for pretrained or checkpoint
        weights; a scratch run's untouched copy of its random init is a replica). Two readings (``context.memory_encoder``, the suite key ``memory_encoder``):

        * ``"trained"`` (default, issue 30 item 9): frozen parameters are excluded, trained ones
          included. A tensor whose name and bytes are still the pretrained encoder's, wherever it sits
          (a frozen feature cache, a frozen ViT inside a prompt method, the frozen blocks of a partly
          tuned one), is the encoder and not counted; every tensor training changed, every replica's
          changed weights, every prompt, adapter, head, statistic and exemplar is counted. Chosen because
          B.4 compares what a method stores beyond the one encoder all methods share: weights a method
          fine-tunes must be stored beside it to run the method.
        * ``"never"`` (B.4 read literally): one live copy of the encoder is never counted, trained or
          not (a fine-tuned ViT replaces the pretrained one); its replicas are. The live copy is the
          first tensor met under each encoder name, walking the method's attributes in order (``model``
          before ``old_model``, as methods assign them)."""
        if self.context.memory_encoder not in MEMORY_ENCODER_READINGS:
            raise MethodError(f"memory_encoder = {self.context.memory_encoder!r}; "
                              f"choose one of {', '.join(MEMORY_ENCODER_READINGS)}")
        report, seen = MemoryReport(), set()
        live = set() if self.context.memory_encoder == "never" else None
        _count(vars(self), report, seen, self.context.shared_backbone or {}, live, self.context.pretrained_encoder)
        return report

    # --- state handling for search (copies trained and thrown away) ---
    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the full state; shared references (optimizer->params) stay shared."""
        return copy.deepcopy({k: v for k, v in vars(self).items() if k != "context"})

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        state = copy.deepcopy(dict(snapshot))
        for key in [k for k in vars(self) if k != "context" and k not in state]:
            delattr(self, key)
        vars(self).update(state)

    def clone(self) -> "Method":
        twin = copy.copy(self)
        twin.__dict__ = {"context": self.context, **self.snapshot()}
        return twin

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.hp}>"


def tensor_digest(t: torch.Tensor) -> str:
    """Digest of a tensor's dtype, shape and exact bytes."""
    t = t.detach()
    h = hashlib.blake2b(f"{t.dtype}:{tuple(t.shape)};".encode(), digest_size=16)
    h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _encoder_name(name: str, shared: Mapping[str, str]) -> str | None:
    """The shared encoder's tensor name that some dotted suffix of ``name`` is, or None."""
    parts = name.split(".")
    for i in range(len(parts)):
        if ".".join(parts[i:]) in shared:
            return ".".join(parts[i:])
    return None


def _is_encoder(name: str, t: torch.Tensor, shared: Mapping[str, str], live: set[str] | None) -> bool:
    """Whether ``t`` (named ``name`` inside the module being walked) is the shared encoder's tensor.
    Reading "trained": some dotted suffix of ``name`` names a tensor of that encoder, with the same bytes
    (the name must match, so a method's own tensor that happens to equal one of the encoder's, a
    LayerNorm initialised to ones, is still counted). Reading "never" (``live`` holds the encoder names
    already met): also the first tensor met under each encoder name, whatever its bytes."""
    encoder = _encoder_name(name, shared)
    if encoder is None or encoder.endswith("num_batches_tracked"):
        return False
    if live is not None and encoder not in live:
        live.add(encoder)
        return True
    return shared[encoder] == tensor_digest(t)


def _count(obj: Any, report: MemoryReport, seen: set[int], shared: Mapping[str, str],
           live: set[str] | None = None, anywhere: bool = False) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        marked = {id(t) for m in obj.modules() if getattr(m, "frozen_shared", False)
                  for t in (*m.parameters(), *m.buffers())} if shared else set()
        for name, p in obj.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                if not ((anywhere or id(p) in marked) and _is_encoder(name, p, shared, live)):
                    report.parameters += p.numel()
        for name, b in obj.named_buffers():
            if id(b) not in seen:
                seen.add(id(b))
                if not ((anywhere or id(b) in marked) and _is_encoder(name, b, shared, live)):
                    report.tensor_elements += b.numel()
    elif hasattr(obj, "exemplar_images"):   # replay buffers report their own images
        n, nbytes = obj.exemplar_images()
        report.exemplars += n
        report.exemplar_bytes += nbytes
    elif isinstance(obj, torch.Tensor):
        report.tensor_elements += obj.numel()
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _count(v, report, seen, shared, live, anywhere)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _count(v, report, seen, shared, live, anywhere)
