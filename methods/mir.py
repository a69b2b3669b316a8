"""MIR, maximally interfered retrieval (Aljundi et al. 2019, "Online continual learning with
maximally interfered retrieval"): experience replay that, instead of a random replay batch,
draws ``candidates`` samples from the reservoir memory, takes a virtual SGD step on the incoming
minibatch, theta' = theta - lr * grad L(B_n; theta), and replays the k samples whose loss rises
most, s(x) = l(f_theta'(x), y) - l(f_theta(x), y) (k = the incoming batch size).

``replay_loss``: ``union`` (default, the paper's Algorithm 1) steps on one mean over the incoming
batch and the retrieved samples; ``sum`` is the authors' code (and Avalanche's MIRPlugin), the mean
over the incoming batch plus the mean over the retrieved samples."""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit.training import OPTIMIZER_SPACE, Trainer
from clharness_methods.er import ER


def virtual_step(model, loss, lr):
    """theta' = theta - lr * dL/dtheta as detached tensors (the model itself is not changed)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: (p - lr * g if g is not None else p).detach() for (n, p), g in zip(named, grads)}


def forward_with(model, params, x):
    """The model's forward with other parameters; batch-norm statistics go to copies, so scoring
    leaves the model's running statistics untouched."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return torch.func.functional_call(model, {**params, **buffers}, (x,))


class MIR(ER):
    name = "mir"
    paper = ("R. Aljundi, L. Caccia, E. Belilovsky, M. Caccia, M. Lin, L. Charlin, T. Tuytelaars, Online Continual "
             "Learning with Maximally Interfered Retrieval, NeurIPS 2019")
    reference = "optimass/Maximally_Interfered_Retrieval: mir.py"
    deviations = ("replay_loss='union' (default): one SGD step on the mean loss over B_n and the retrieved samples "
                  "(Algorithm 1); 'sum' is the authors' code (and Avalanche's MIRPlugin): the replay loss added as "
                  "a second mean, about twice the replay's weight",
                  "offline tasks: the memory is offered the task's samples after the task (ER's offline form), so "
                  "candidates come from earlier tasks; the authors' single-pass code adds each minibatch to the "
                  "reservoir after its step and excludes the current task when sampling candidates",
                  "k = the incoming batch size; the virtual step uses the method's lr")
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["reservoir", "class-balanced"]),
               "candidates": clh.Int(1, 10000, default=50),     # memory subsample scored per step
               # "union": one mean over B_n and the retrieved samples (Algorithm 1: SGD on B_n u B_C);
               # "sum": mean over B_n plus mean over the retrieved samples, the authors' code (two
               # backward passes) and Avalanche's MIRPlugin: about twice the replay's weight
               "replay_loss": clh.Choice(["union", "sum"])}
    later_hparams = {"replay_loss": "union"}   # added later: stored runs keep their keys

    def sample_loss(self, logits, y):
        return F.cross_entropy(self.labels.mask(logits, y), y, reduction="none")

    def interference(self, x, y, cx, cy):
        """s(x_c) for every candidate: loss after the virtual step minus loss before it."""
        current = dict(self.model.named_parameters())
        virtual = virtual_step(self.model, self.cross_entropy(forward_with(self.model, current, x), y), self.hp["lr"])
        with torch.no_grad():
            before = self.sample_loss(forward_with(self.model, current, cx), cy)
            after = self.sample_loss(forward_with(self.model, virtual, cx), cy)
        return after - before

    def retrieve(self, x, y):
        cx, cy = self.buffer.sample(self.hp["candidates"], self.gen)
        top = self.interference(x, y, cx, cy).topk(min(len(y), len(cy))).indices
        return cx[top], cy[top]

    def mir_loss(self, x, y):
        if not len(self.buffer):
            return self.cross_entropy(self.model(x), y)
        mx, my = self.retrieve(x, y)
        if self.hp["replay_loss"] == "sum":
            return self.cross_entropy(self.model(x), y) + self.cross_entropy(self.model(mx), my)
        return self.cross_entropy(self.model(torch.cat([x, mx])), torch.cat([y, my]))

    def step(self, x, y):
        self.trainer = getattr(self, "trainer", None) or Trainer.for_method(self)
        self.model.train()
        self.trainer.step(self.mir_loss, x, y)

    def observe(self, batch):
        self.step(batch.x, batch.y)
        self.trainer.check()
        self.buffer.add(batch.x, batch.y)

    def learn(self, experience):
        self.labels.add(experience)
        for x, y in experience.batches(epochs=self.context.epochs):
            self.step(x, y)
        self.trainer.check()
        for x, y in experience.batches(augment=False):   # one pass, raw views: each sample offered once
            self.buffer.add(x, y)
