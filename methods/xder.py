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
  each hinge averaged over the samples where it is positive (the reference).

Defaults: mammoth's ``xder`` arguments (gamma 0.85, eta 0.1, m 0.3) and its Seq-CIFAR-100 config
(alpha 0.3, beta 0.8, SGD lr 0.03).

Heads without contiguous class ids: a task's head is its set of global class ids (the harness
shuffles class order), and the future heads are all classes not seen yet (the reference slices
``[(t+1)*cpt:]``); in the class-incremental setting the future tasks' partition is unknown, which
only the omitted contrastive term below would need.

Deliberate differences from the reference:
- no future-heads contrastive consistency (the reference's SupCon term ``lambd`` on strongly
  augmented views, one loss per future head): it needs the partition of the unseen classes into
  future tasks and a strong augmentation the harness does not provide; ``dp_weight``/``align_bn``
  of newer configs are not implemented either;
- stored task labels are not kept (the reference stores them but no loss reads them);
- the end-of-task memory pass runs the network in eval mode on the raw samples (the reference:
  train-mode BatchNorm without updating its statistics, on augmented views); during training,
  augmentation is the reference's (train on a view, store raw samples, replay fresh views);
- task boundaries are needed (memory is built at the end of each task): no online setting, as the
  reference (COMPATIBILITY class-il, task-il).
"""
import torch
import torch.nn.functional as F

import clharness as clh
from clharness.buffers import ReservoirBuffer
from clharness.training import NEG, Trainer, optimizer_space
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


class XDER(DERpp):
    name = "xder"
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL})
    hparams = {**optimizer_space(lr=0.03),
               "alpha": clh.Float(0.0, 10.0, default=0.3),    # logit replay (all heads)
               "beta": clh.Float(0.0, 10.0, default=0.8),     # label replay (past heads)
               "gamma": clh.Float(0.0, 1.0, default=0.85),    # damping of transplanted logits
               "eta": clh.Float(0.0, 10.0, default=0.1),      # weight of the past/future constraints
               "margin": clh.Float(0.0, 10.0, default=0.3)}   # m of the constraints

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.task = 0                                    # tasks finished
        self.class_task = torch.full((context.num_classes,), -1, dtype=torch.long, device=context.device)
        self.update_counter = torch.zeros(context.memory_size, device=context.device)

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
        return loss

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
