"""Progressive Neural Networks (Rusu et al. 2016, "Progressive neural networks"), as Avalanche's
``PNN`` model and ``PNNStrategy`` build them: one column (an MLP) per task; column k's layer i
reads its own layer i-1 and, through a lateral adapter, layer i-1 of every earlier column,

    h_i^(k) = f(W_i^(k) h_{i-1}^(k) + U_i^(k) f(V_i^(k) [alpha_i^(k,j) h_{i-1}^(j)]_{j<k}))   (eq. 2)

(``adapter="mlp"``: the learned scalars alpha, V projecting the concatenated earlier activations
to one column's width n_{i-1}, U to layer i's width; ``adapter="linear"``: eq. 1,
sum_{j<k} U_i^(k:j) h_{i-1}^(j)). When task k arrives its column is added and every earlier
column is frozen, so what earlier tasks compute is never changed (no forgetting, by
construction); predictions for task t run columns 0..t and read column t's head.

Task-incremental only: the column is chosen by the task id (M2I evaluates PNN only there). For a
user's own probe outside the harness, an experience without a task id gets a new column (as
Avalanche treats each experience as a task) and ``predict`` without one lets every column answer
for its own task's classes.

Deliberate differences:
- The columns are MLPs built from ``context.input_shape`` (flatten, ``layers`` hidden ReLU layers of
  width ``hidden``, a head over all ``num_classes``), not the suite's backbone: PNN needs every
  layer's activation of every column, and Avalanche's PNN is likewise linear layers only (M2I
  section 4 matches its depth to the CNNs' instead). The suite's backbone is not used.
- Laterals feed layers 2..L and the head, from the earlier columns' hidden layers (eq. 1-2 with
  i >= 2); Avalanche also adds an adapter on the raw input at layer 1, which repeats x. Rusu's
  output layer takes laterals too, Avalanche's multi-head classifier does not: we follow the paper.
- V maps to n_{i-1} units as the paper's eq. 2 says (Avalanche maps to layer i's width, the same
  when the widths are equal); alpha starts at N(0, 1) draws as in Avalanche.
- A task id not yet learned (the runner also scores future tasks) reads the newest column.

``laterals = "avalanche"`` (an option; default "paper", as above) builds Avalanche 0.2.1's
connections instead, as the M2I authors ran it (lifelonglab/M2I_I2M_benchmark models/model_provider.py:
``PNN(num_layers=..., in_features=12288, adapter="mlp")``): an adapter into every hidden layer,
layer 1's reading the raw input again (x, once per earlier column), none into the head, and V mapping
to layer i's width (avalanche/models/pnn.py ``PNNColumn``, ``MLPAdapter``, ``PNN.forward_single_task``).
The head stays one linear layer per column over all classes, as Avalanche's ``MultiHeadClassifier``
has one per task.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

import clharness as clh
from clharness.method import MethodError
from clharness.toolkit.training import NEG, OPTIMIZER_SPACE, TaskLabels, Trainer, eval_mode


class LateralAdapter(nn.Module):
    """The lateral connections into one layer of column k from layer i-1 of columns 0..k-1."""

    def __init__(self, in_features: int, out_features: int, num_prev: int, kind: str, mid: int | None = None):
        super().__init__()
        self.kind = kind
        if kind == "mlp":      # eq. 2: U f(V [alpha_j h^(j)]_j); V to ``mid`` units (eq. 2: n_{i-1})
            mid = in_features if mid is None else mid
            self.alphas = nn.Parameter(torch.randn(num_prev))
            self.V = nn.Linear(in_features * num_prev, mid)
            self.U = nn.Linear(mid, out_features)
        elif kind == "linear":   # eq. 1: sum_j U^(k:j) h^(j)
            self.U = nn.ModuleList(nn.Linear(in_features, out_features, bias=False) for _ in range(num_prev))
        else:
            raise ValueError(f"unknown PNN adapter {kind!r}; choose mlp or linear")

    def forward(self, previous: list[torch.Tensor]) -> torch.Tensor:
        if self.kind == "mlp":
            scaled = torch.cat([a * h for a, h in zip(self.alphas, previous)], dim=1)
            return self.U(F.relu(self.V(scaled)))
        return sum(u(h) for u, h in zip(self.U, previous))


class Column(nn.Module):
    """One task's MLP: ``widths`` = [input, hidden..., classes]. Adapters (laterals "paper") on every
    layer past the first, the head included; (laterals "avalanche") on every hidden layer, the first
    included, not the head. ``adapters[i - first_adapted]`` feeds layer i."""

    def __init__(self, widths: list[int], num_prev: int, adapter: str, laterals: str = "paper"):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        if laterals == "paper":
            self.first_adapted = 1
            make = (lambda i: LateralAdapter(widths[i], widths[i + 1], num_prev, adapter))
        elif laterals == "avalanche":
            self.first_adapted = 0
            make = (lambda i: LateralAdapter(widths[i], widths[i + 1], num_prev, adapter, mid=widths[i + 1]))
        else:
            raise ValueError(f"unknown PNN laterals {laterals!r}; choose paper or avalanche")
        adapted = range(self.first_adapted, len(widths) - 2 + self.first_adapted)
        self.adapters = nn.ModuleList(make(i) for i in adapted) if num_prev else nn.ModuleList()

    def freeze(self) -> None:
        for p in self.parameters():
            p.requires_grad_(False)


class ProgressiveNet(nn.Module):
    """The columns; ``forward(x, column)`` runs columns 0..column layer by layer and returns the
    chosen column's logits (and, with ``hidden=True``, its last hidden layer)."""

    def __init__(self, widths: list[int], adapter: str, laterals: str = "paper"):
        super().__init__()
        self.widths, self.adapter, self.laterals = widths, adapter, laterals
        self.columns = nn.ModuleList()

    def add_column(self) -> Column:
        for column in self.columns:
            column.freeze()
        column = Column(self.widths, len(self.columns), self.adapter, self.laterals)
        self.columns.append(column)
        return column

    def forward(self, x: torch.Tensor, column: int, hidden: bool = False):
        h = [x.flatten(1)] * (column + 1)                 # h_0^(k) = x for every column k
        depth = len(self.widths) - 1
        for i in range(depth):
            out = []
            for k in range(column + 1):
                z = self.columns[k].layers[i](h[k])
                j = i - self.columns[k].first_adapted
                if k > 0 and 0 <= j < len(self.columns[k].adapters):
                    z = z + self.columns[k].adapters[j](h[:k])
                out.append(F.relu(z) if i < depth - 1 else z)
            if hidden and i == depth - 2:
                features = out[column]
            h = out
        return (h[column], features) if hidden else h[column]


class PNN(clh.Method):
    name = "pnn"
    paper = "A. A. Rusu et al., Progressive Neural Networks, arXiv:1606.04671 2016"
    reference = "ContinualAI/avalanche: avalanche/models/pnn.py"
    deviations = ("columns are MLPs built from the input shape, not the suite's backbone (as Avalanche's PNN)",
                  "laterals feed layers 2..L and the head from the earlier columns' hidden layers (eq. 2); "
                  "Avalanche also adapts the raw input at layer 1 and gives its multi-head classifier no laterals "
                  "(laterals='avalanche' builds Avalanche's)",
                  "V maps to n_{i-1} units (eq. 2); Avalanche maps to layer i's width (so does laterals='avalanche')",
                  "a task id not learned yet reads the newest column")
    settings = frozenset({clh.Setting.TASK_IL})
    hparams = {**OPTIMIZER_SPACE,
               "layers": clh.Int(1, 64, default=2),          # hidden layers per column
               # units per hidden layer. M2I Table 9 says "Number of columns = 200"; the authors' code
               # passes no width, so Avalanche's hidden_features_per_column=100 ran (the M2I suites set 100)
               "hidden": clh.Int(8, 4096, default=200),
               "adapter": clh.Choice(["mlp", "linear"]),     # eq. 2 (Avalanche's default) or eq. 1
               "laterals": clh.Choice(["paper", "avalanche"])}   # where the adapters go (module docstring)
    later_hparams = {"laterals": "paper"}   # added later: stored runs keep their keys

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        widths = [math.prod(context.input_shape)] + [self.hp["hidden"]] * self.hp["layers"] + [context.num_classes]
        self.model = ProgressiveNet(widths, self.hp["adapter"], self.hp["laterals"]).to(context.device)
        self.labels = TaskLabels(context)
        self.task_column: dict[int, int] = {}     # task id -> its column
        self.column_classes: list[tuple[int, ...]] = []

    def learn(self, experience):
        self.labels.add(experience)
        task = experience.task_id if experience.task_id is not None else -len(self.labels.tasks)
        if task not in self.task_column:     # a new task: freeze the old columns, add one
            self.task_column[task] = len(self.model.columns)
            self.column_classes.append(tuple(experience.classes))
            with torch.random.fork_rng(devices=[]):   # seeded by run and column: a restored snapshot
                torch.manual_seed(self.context.seed * 1000 + len(self.model.columns))   # grows the same
                self.model.add_column().to(self.context.device)
        column = self.task_column[task]
        trainer = Trainer.for_method(self, self.model.columns[column].parameters())
        self.model.train()

        def loss(x, y):
            return F.cross_entropy(self.labels.mask(self.model(x, column), y), y)
        for x, y in experience.batches(epochs=self.context.epochs):
            trainer.step(loss, x, y)
        trainer.check()

    @torch.no_grad()
    def predict(self, x, task_id=None):
        """Column ``task_id``'s logits (the newest column for a task not learned yet). Without a task
        id: every column's logits over its own task's classes, NEG elsewhere."""
        eval_mode(self.model)
        if not self.model.columns:
            return torch.zeros(len(x), self.context.num_classes, device=x.device)
        if task_id is not None:
            return self.model(x, self.task_column.get(task_id, len(self.model.columns) - 1))
        logits = torch.full((len(x), self.context.num_classes), NEG, device=x.device)
        for column, classes in enumerate(self.column_classes):
            logits[:, list(classes)] = self.model(x, column)[:, list(classes)]
        return logits

    @torch.no_grad()
    def features(self, x):
        """The newest column's last hidden layer (features take no task id)."""
        if not self.model.columns:
            raise MethodError("pnn has no column before its first task")
        eval_mode(self.model)
        return self.model(x, len(self.model.columns) - 1, hidden=True)[1]
