"""CBRS, class-balancing reservoir sampling (Chrysakis & Moens 2020, "Online continual learning
from imbalanced data", Algorithm 1): experience replay whose memory is kept as class-balanced as
possible at all times. While the memory has room every instance is stored. When it is full, an
instance of a class that is not "full" replaces a random instance of a largest class; an instance
of a full class replaces a random instance of its own class with probability m_c / n_c (reservoir
sampling within the class: m_c its stored instances, n_c its instances seen). A class is full if
it is, or at some earlier time step was, a largest class of the memory (section 4), so a class
that lost slots to newer classes does not win them back.

Deliberate reading: "largest" is tracked from the time step the memory fills on. During the fill
phase every instance is stored anyway, and counting it would make the stream's first class full
after one instance (a rare class that came first could then never grow)."""
import clharness as clh
from clharness.toolkit.buffers import ClassBalancedBuffer
from clharness.toolkit.training import OPTIMIZER_SPACE
from clharness_methods.er import ER


class CBRSBuffer(ClassBalancedBuffer):
    """``ClassBalancedBuffer`` with the paper's notion of a full class (is or ever was largest)
    instead of "currently holds as many slots as the largest class"."""

    def __init__(self, capacity: int, seed: int = 0):
        super().__init__(capacity, seed)
        self.full: set[int] = set()      # classes that are or were a largest class once memory filled

    def _place(self, labels: list[int]) -> dict[int, int]:
        writes: dict[int, int] = {}
        slots, class_seen, full = self.slots, self.class_seen, self.full
        for row, c in enumerate(labels):
            class_seen[c] = class_seen.get(c, 0) + 1
            own = slots.setdefault(c, [])
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            else:
                largest = max(map(len, slots.values()))
                if c not in full:
                    donor = slots[self.rng.choice([k for k, s in slots.items() if len(s) == largest])]
                    slot = donor.pop(self.rng.randrange(len(donor)))
                else:
                    j = self.rng.randrange(class_seen[c])
                    if j >= len(own):
                        continue
                    slot = own.pop(j)      # a uniformly random slot of this class
            own.append(slot)
            writes.pop(slot, None)
            writes[slot] = row
            if self.size == self.capacity:   # the memory's largest classes after this instance are full
                largest = max(map(len, slots.values()))
                full.update(k for k, s in slots.items() if len(s) == largest)
        self.seen += len(labels)
        return writes


class CBRS(ER):
    name = "cbrs"
    ensemble = True   # seeds train as one batched model (engine.ensemble): members equal their solo runs (ER's replay steps, its own memory per member)
    version = "2"   # 2: "full" means is or ever was largest (the paper), not only currently largest
    paper = "A. Chrysakis, M.-F. Moens, Online Continual Learning from Imbalanced Data, ICML 2020 (Algorithm 1)"
    reference = "WuYichen-97/Meta-Continual-Learning-Revisited-ICLR2024: utils/cbrs_buffer.py"
    deviations = ("the authors published no code; the reference is a third-party mammoth-based buffer, which counts "
                  "n_c for a whole minibatch before placing its rows: ours counts each instance as it arrives "
                  "(Algorithm 1)",
                  "'largest' is tracked from the time step the memory fills on (deliberate reading, see the module "
                  "docstring)",
                  "training is ER's (the stream batch with an equal-size random replay batch)")
    settings = frozenset({clh.Setting.CLASS_IL, clh.Setting.TASK_IL, clh.Setting.ONLINE})
    hparams = {**OPTIMIZER_SPACE, "buffer": clh.Choice(["class-balanced"])}

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        self.buffer = CBRSBuffer(context.memory_size, seed=context.seed)
