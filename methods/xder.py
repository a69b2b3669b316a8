"""X-DER, eXtended Dark Experience Replay (Boschini et al. 2022, "Class-incremental continual learning
into the eXtended DER-verse", TPAMI; reference: aimagelab/mammoth ``models/xder.py``).

DER++ (``methods/derpp.py``) with a memory whose logits are kept up to date, and constraints that
prepare the heads of classes not seen yet. With t the current task, "past heads" the classes of
tasks < t, the "current head" task t's classes and "future heads" the classes not seen yet:

- memory: filled at the end of each task, class-balanced (the old classes keep their first
  M // seen-classes exemplars, the new classes share the free slots), each new sample stored with
  its logits after the past heads are damped (below);
- future-past update ("update of the memory buffer", paper section 3.1): when a buffered sample of
  an old task is replayed while learning task t, its stored logits for the current and future heads
  are replaced by the network's current response (with probability 1/(times replayed in this task),
  and for every buffered sample once more at the end of the task). Every update rescales the
  transplanted block so it cannot beat the sample's stored ground-truth logit: if its maximum m
  exceeds z_y, it is multiplied by gamma z_y / m (the reference's ``update_logits``);
- loss = CE over the current head on the stream batch
       + alpha MSE(h(x'), z') on a memory batch (all heads; DER)
       + beta CE over the past heads on a second memory batch (DER++)
       + eta mean[max(0, max p_past(x) + m - max p_current(x))]  (past constraint, softmax over seen heads,
         the past term detached)
       + eta mean[max(0, max h_future + m - max h_own)]  (future constraint on stream and memory samples,
         h_own the head of the sample's own task),
       + lambd sum_h SupCon(h) / (H n)  (future-heads consistency while future heads exist, as the
         reference computes it (the paper text is not available offline): the first
         ``simclr_batch_size`` raw stream samples and as many raw memory samples, n in all, each in
         ``simclr_num_aug`` strong views (``clharness.toolkit.augment.StrongAugmentation``, the reference's
         strong_aug) forwarded with BatchNorm statistics frozen; for each of the H future heads its
         logits, L2-normalised per view, go through the supervised contrastive loss of Khosla et
         al. 2020, eq. 2 (``supcon_loss``, labels the samples' classes, temperature = base
         temperature = ``simclr_temp``, summed over samples)),
  each hinge averaged over the samples where it is positive (the reference).

Defaults: mammoth's best arguments (``utils/best_args.py`` of the X-DER release), the only ones it
ships for X-DER: Seq-CIFAR-100 with a 500-sample buffer (``preset="seq-cifar100-500"``: alpha 0.3,
beta 0.8, gamma 0.85, eta 0.001, m 0.7, lambd 0.05, simclr_temp 5, simclr_batch_size 64,
simclr_num_aug 2, SGD lr 0.03 without momentum or weight decay) or 2000 (``"seq-cifar100-2000"``:
alpha 0.6, beta 0.9, eta 0.01, m 0.2, the rest equal). Its argparse defaults (eta 0.1, m 0.3, lambd
0.1), which earlier versions used, are 10-100x off these; ``preset="custom"`` sets every weight by
hand (each defaults to the seq-cifar100-500 value).

Heads: a task's head is its set of global class ids, and the future heads of the constraints are all
classes not seen yet. The consistency term needs the future heads one by one: the unseen classes in
global id order cut into chunks of the current task's class count (``future_heads``). Split
scenarios give each task a contiguous range of ids (positions in the class order), so these chunks
are the future tasks, the reference's ``[(t+1)*cpt:]`` split; for kinds whose tasks are not
contiguous id ranges of equal size the chunks are only a fixed partition of the unseen classes.

Deliberate differences from the reference:
- the future heads of the consistency term are id-order chunks of the current task's size (above);
- strong views are drawn on the device for the whole batch from the normalised raw samples
  (``StrongAugmentation``: float pixels, no PIL rounding, bilinear crops without antialiasing; on
  1-channel inputs no saturation, hue or grayscale), from the method's own seeded generator;
- ``dp_weight``/``align_bn`` of newer configs are not implemented;
- stored task labels are not kept (the reference stores them but no loss reads them);
- the end-of-task memory pass runs the network in eval mode on the raw samples (the reference:
  train-mode BatchNorm without updating its statistics, on augmented views); during training,
  augmentation is the reference's (train on a view, store raw samples, replay fresh views);
- task boundaries are needed (memory is built at the end of each task): no online setting, as the
  reference (COMPATIBILITY class-il, task-il).
"""
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

import clharness as clh
from clharness.toolkit import augment
from clharness.toolkit.buffers import ReservoirBuffer
from clharness.toolkit.training import NEG, Trainer, optimizer_space
from clharness_methods.derpp import DERpp, raw_batches


def transplant(old, new, gt, cols, gamma):
    """``old`` with columns ``cols`` (bool mask) replaced by ``new``'s; in rows where the transplanted
    block's maximum m exceeds the ground-truth logit z_y = old[y], the block is scaled by gamma z_y / m
    (the reference's ``update_logits``)."""
    old = old.clone()
    block = new[:, cols].clone()
    gt_values = old[torch.arange(len(gt), device=gt.device), gt]
    max_values = block.max(1).values
    scale = torch.where(max_values > gt_values, gamma * gt_values / max_values, torch.ones_like(max_values))
    old[:, cols] = block * scale[:, None]
    return old


def supcon_loss(features, labels, temperature, base_temperature=None):
    """Supervised contrastive loss (Khosla et al. 2020, eq. 2, "L^sup_out") of ``features``
    (N samples, V views, D; L2-normalised by the caller) with ``labels`` (N). Every one of the N V
    views is an anchor i; its positives P(i) are the other views of its sample and all views of the
    other samples with its label; A(i) is every view but i itself:

        l_i = -(temperature / base_temperature) / |P(i)| sum_{p in P(i)} log softmax_{a in A(i)}(z_i . z_a / temperature)[p]

    Returns sum_i l_i / V, i.e. the per-sample mean over its views summed over samples (the
    reference's SupConLoss with reduction "sum"). V >= 2 guarantees every anchor a positive."""
    n, v, _ = features.shape
    if v < 2:
        raise ValueError(f"supcon_loss needs at least 2 views per sample, got features of shape {tuple(features.shape)}")
    base_temperature = temperature if base_temperature is None else base_temperature
    z = features.transpose(0, 1).reshape(n * v, -1)                 # view-major: anchor k is sample k % n
    sim = z @ z.T / temperature
    self_mask = torch.eye(n * v, dtype=torch.bool, device=z.device)
    log_prob = sim - torch.logsumexp(sim.masked_fill(self_mask, float("-inf")), 1, keepdim=True)
    lab = labels.repeat(v)
    positive = (lab[:, None] == lab[None, :]) & ~self_mask
    per_anchor = -(log_prob * positive).sum(1) / positive.sum(1)
    return (temperature / base_temperature) * per_anchor.sum() / v


@contextmanager
def frozen_bn_stats(model: nn.Module):
    """BatchNorm layers in ``model`` normalise with batch statistics (train mode) without updating
    their running statistics (the reference's ``bn_track_stats(self, False)``)."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    tracked = [m.track_running_stats for m in layers]
    for m in layers:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m, flag in zip(layers, tracked):
            m.track_running_stats = flag


def future_heads(future: torch.Tensor, classes_per_task: int) -> list[torch.Tensor]:
    """The unseen classes (bool mask over global ids) in id order, cut into chunks of
    ``classes_per_task`` ids (the last one shorter when they do not divide evenly)."""
    ids = future.nonzero().squeeze(1)
    return list(ids.split(classes_per_task)) if len(ids) else []


# mammoth ``utils/best_args.py`` (the X-DER release, commit 0d727a7), ``seq-cifar100`` -> ``xder`` ->
# buffer size: the only best arguments the reference ships for X-DER. Both also fix lr 0.03, momentum 0
# and weight decay 0, the defaults of the optimizer hyperparameters below. ``m`` is ``margin`` here.
PRESETS = {
    "seq-cifar100-500": {"alpha": 0.3, "beta": 0.8, "gamma": 0.85, "eta": 0.001, "margin": 0.7, "lambd": 0.05,
                         "simclr_temp": 5.0, "simclr_batch_size": 64, "simclr_num_aug": 2},
    "seq-cifar100-2000": {"alpha": 0.6, "beta": 0.9, "gamma": 0.85, "eta": 0.01, "margin": 0.2, "lambd": 0.05,
                          "simclr_temp": 5.0, "simclr_batch_size": 64, "simclr_num_aug": 2},
}
DEFAULT_PRESET = "seq-cifar100-500"
_CUSTOM = {"preset": ["custom"]}       # the individual hyperparameters are read only under preset="custom"
_D = PRESETS[DEFAULT_PRESET]


class XDER(DERpp):
    name = "xder"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    paper = ("Boschini, Bonicelli, Buzzega, Porrello, Calderara, Class-Incremental Continual Learning into the "
             "eXtended DER-verse, TPAMI 2022")
    reference = "aimagelab/mammoth: models/xder.py (best arguments: utils/best_args.py)"
    deviations = (
        "future heads of the consistency term: id-order chunks of the current task's class count",
        "strong views drawn on the device from normalised samples (no PIL rounding; 1-channel: no colour ops)",
        "dp_weight / align_bn of newer mammoth configs not implemented",
        "stored task labels not kept (no loss reads them)",
        "end-of-task memory pass in eval mode on raw samples (reference: train-mode BN, frozen stats, "
        "augmented views)",
        "defaults: mammoth's best_args for seq-cifar100 with buffer 500 (preset), whatever the suite's "
        "dataset and memory; preset='custom' sets each weight by hand",
    )
    hparams = {**optimizer_space(lr=0.03),
               # the reference's best arguments per dataset and buffer (``PRESETS``), or "custom"
               "preset": clh.Choice([*PRESETS, "custom"], default=DEFAULT_PRESET),
               "alpha": clh.Float(0.0, 10.0, default=_D["alpha"], when=_CUSTOM),    # logit replay (all heads)
               "beta": clh.Float(0.0, 10.0, default=_D["beta"], when=_CUSTOM),      # label replay (past heads)
               "gamma": clh.Float(0.0, 1.0, default=_D["gamma"], when=_CUSTOM),    # damping of transplanted logits
               "eta": clh.Float(0.0, 10.0, default=_D["eta"], when=_CUSTOM),        # weight of the constraints
               "margin": clh.Float(0.0, 10.0, default=_D["margin"], when=_CUSTOM),  # m of the constraints
               "lambd": clh.Float(0.0, 10.0, default=_D["lambd"], when=_CUSTOM),    # future-heads consistency
               "simclr_temp": clh.Float(0.01, 100.0, default=_D["simclr_temp"], when=_CUSTOM),   # SupCon temperature
               "simclr_batch_size": clh.Int(1, 4096, default=_D["simclr_batch_size"], when=_CUSTOM),
               "simclr_num_aug": clh.Int(2, 16, default=_D["simclr_num_aug"], when=_CUSTOM)}   # views per sample
    # 2: the future-heads consistency term (SupCon on strong views); 3: mammoth's best arguments
    # (eta 0.1 -> 0.001, m 0.3 -> 0.7, lambd 0.1 -> 0.05 by default)
    version = "3"

    def __init__(self, context, **hparams):
        preset = hparams.get("preset", DEFAULT_PRESET)
        given = sorted(set(hparams) & set(_D))
        if preset != "custom" and given:
            raise clh.MethodError(f"xder: {given} are set by preset={preset!r} (mammoth's best arguments); "
                                  "pass preset='custom' to set them by hand")
        super().__init__(context, **hparams)
        if self.hp["preset"] != "custom":
            self.hp = {**self.hp, **PRESETS[self.hp["preset"]]}
        self.task = 0                                    # tasks finished
        self.class_task = torch.full((context.num_classes,), -1, dtype=torch.long, device=context.device)
        self.update_counter = torch.zeros(context.memory_size, device=context.device)
        self.strong = augment.StrongAugmentation()
        self.strong_gen = torch.Generator(device=context.device).manual_seed(context.seed + 7)
        self.frame = None                                # the data's pixel frame, set by learn()
        self.classes_per_task = 0                        # the current task's class count

    # --- column groups of the current task ---
    def heads(self):
        current = self.labels.current
        seen = self.class_task >= 0
        return seen & ~current, current, ~seen          # past, current, future

    def xder_loss(self, x, y, view=None):
        view = view or (lambda x: x)
        past, current, future = self.heads()
        eta, m = self.hp["eta"], self.hp["margin"]
        logits = self.model(view(x)).float()
        loss = F.cross_entropy(self.labels.mask_current(logits), y)          # current head only
        buf = None
        if len(self.buffer):
            x1, y1, z1, i1 = self.sample(len(y))
            o1 = self.model(view(x1)).float()
            loss = loss + self.hp["alpha"] * F.mse_loss(o1, z1)              # DER, all heads
            x2, y2, z2, i2 = self.sample(len(y))
            o2 = self.model(view(x2)).float()
            loss = loss + self.hp["beta"] * self.cross_entropy(o2.masked_fill(~past, NEG), y2)   # past heads
            buf = self.merge((i1, y1, z1, o1), (i2, y2, z2, o2))
            self.future_past_update(*buf[:3], buf[3].detach(), past)
        if past.any():             # past constraint: the current head must win by m over the past ones
            p = F.softmax(logits.masked_fill(~(past | current), NEG), 1)
            hinge = p[:, past].max(1).values.detach() + m - p[:, current].max(1).values
            loss = loss + self.hinge(hinge, eta)
        if future.any():           # future constraint: future heads must lose by m to the own head
            bad, good = logits[:, future].max(1).values, logits[:, current].max(1).values
            if buf is not None:
                _, by, _, bo = buf
                own = self.class_task[None, :] == self.class_task[by][:, None]
                bad = torch.cat([bad, bo[:, future].max(1).values])
                good = torch.cat([good, bo.masked_fill(~own, NEG).max(1).values])
            loss = loss + self.hinge(bad + m - good, eta)
        consistency = self.consistency_loss(x, y, future)
        return loss if consistency is None else loss + consistency

    def consistency_loss(self, x, y, future):
        """Future-heads consistency: SupCon (``supcon_loss``) on the logits of each future head over
        strong views of the first ``simclr_batch_size`` raw stream samples and as many raw memory
        samples, BatchNorm statistics untouched; lambd sum_h SupCon_h / (heads x samples). None when
        there is no future head (the last task) or lambd is 0."""
        heads = future_heads(future, self.classes_per_task)
        if not heads or self.hp["lambd"] == 0:
            return None
        n, views = self.hp["simclr_batch_size"], self.hp["simclr_num_aug"]
        xs, ys = x[:n], y[:n]
        if len(self.buffer):
            bx, by, _, _ = self.sample(n)
            xs, ys = torch.cat([bx, xs]), torch.cat([by, ys])
        with torch.no_grad():
            strong = self.strong.train(xs.repeat_interleave(views, 0), self.frame, tuple(xs.shape[-2:]),
                                       self.strong_gen)
        with frozen_bn_stats(self.model):
            out = self.model(strong).float().view(len(xs), views, -1)
        total = sum(supcon_loss(F.normalize(out[:, :, head], dim=2), ys, self.hp["simclr_temp"]) for head in heads)
        return self.hp["lambd"] * total / (len(heads) * len(xs))

    @staticmethod
    def hinge(values, weight):
        positive = values > 0
        return weight * values[positive].mean() if positive.any() else values.new_zeros(())

    @staticmethod
    def merge(*draws):
        """The two memory draws concatenated, each slot once (first occurrence kept)."""
        idx, y, z, out = (torch.cat(parts) for parts in zip(*draws))
        seen, first = set(), []
        for slot in idx.tolist():
            first.append(slot not in seen)
            seen.add(slot)
        first = torch.tensor(first, device=idx.device)
        return idx[first], y[first], z[first], out[first]

    @torch.no_grad()
    def future_past_update(self, idx, y, z, out, past):
        """Section 3.1: replayed old-task samples take the current response for the current and future
        heads, each with probability 1/(times replayed in this task)."""
        old = past[y]                                     # every memory sample is an old-task one
        if not old.any():
            return
        self.update_counter[idx[old]] += 1
        draw = torch.rand(int(old.sum()), generator=self.gen).to(out.device)
        chosen = old.clone()
        chosen[old] = draw * self.update_counter[idx[old]] < 1
        if chosen.any():
            self.buffer_logits[idx[chosen]] = transplant(z[chosen], out[chosen], y[chosen], ~past,
                                                         self.hp["gamma"])

    def learn(self, experience):
        self.labels.add(experience)
        self.class_task[list(experience.classes)] = self.task
        self.classes_per_task = len(experience.classes)
        self.frame = getattr(experience.data, "frame", None)
        if self.frame is None and self.hp["lambd"] > 0:
            raise clh.MethodError("xder's consistency term needs the data's pixel frame (experience.data.frame, "
                                  "as TensorData and StreamData have) to draw strong views; set lambd = 0 "
                                  "to train without it")
        self.trainer = Trainer.for_method(self)
        self.model.train()
        for x, y in raw_batches(experience, self.context.epochs):
            self.trainer.step(self.xder_loss, x, y, experience.augment)
        self.trainer.check()
        self.end_task(experience)

    def observe(self, batch):
        raise clh.MethodError("xder builds its memory at task boundaries: it runs in class- and "
                              "task-incremental settings, not on a task-free stream")

    @torch.no_grad()
    def end_task(self, experience):
        past, current, _ = self.heads()
        self.model.eval()
        gamma, capacity = self.hp["gamma"], self.buffer.capacity
        # 1. shrink: each old class keeps its first M // (seen classes) exemplars
        x_old, y_old = self.buffer.tensors()
        z_old = self.buffer_logits[:len(self.buffer)]
        self.buffer = ReservoirBuffer(capacity, seed=self.context.seed + self.task + 1)
        self.buffer_logits = torch.zeros(0, self.context.num_classes, device=self.context.device)
        per_class = capacity // int((self.class_task >= 0).sum())
        for c in sorted(set(y_old.tolist())):
            keep = (y_old == c).nonzero().squeeze(1)[:per_class]
            self.store(x_old[keep], y_old[keep], z_old[keep])
        # 2. the new classes share the free slots (remainder to random classes), first come first kept
        new_classes = list(experience.classes)
        free = capacity - len(self.buffer)
        quota = {c: free // len(new_classes) for c in new_classes}
        for k in torch.randperm(len(new_classes), generator=self.gen)[:free % len(new_classes)].tolist():
            quota[new_classes[k]] += 1
        for x, y in experience.batches(augment=False):
            if not any(quota.values()):
                break
            out = self.model(x).float()
            if past.any():          # the new samples' past heads may not beat their own logit
                out = transplant(out, out, y, past, gamma)
            rows = []
            for row, c in enumerate(y.tolist()):
                if quota.get(c, 0) > 0:
                    quota[c] -= 1
                    rows.append(row)
            if rows:
                rows = torch.tensor(rows, device=y.device)
                self.store(x[rows], y[rows], out[rows])
        # 3. future-past update of every old-task sample: current and future heads from the network now
        x_all, y_all = self.buffer.tensors()
        old = past[y_all]
        if old.any():
            out = torch.cat([self.model(x_all[i:i + 256]).float() for i in range(0, len(x_all), 256)])
            self.buffer_logits[:len(self.buffer)][old] = transplant(
                self.buffer_logits[:len(self.buffer)][old], out[old], y_all[old], ~past, gamma)
        self.task += 1
        self.update_counter.zero_()
