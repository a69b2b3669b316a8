"""Searching for a challenging task sequence (CLDyB section 3.2, eqs. 1, 2, 5-7; figure 2).

At every step t the M live methods define the state F^{t-1}. Stage A proposes candidates (greedy
hard-task sampling + functional clustering, ``sampling.py`` and ``clustering.py``); stage B values
each candidate by training *copies* of every method on it (``Method.clone()``), scoring them on the
validation data of every task so far, and throwing the copies away:

* immediate reward R(F^{t-1}, T) = AFM - ALA after learning T, averaged over the M models (eqs. 1, 2, 5);
* value = R + the best l-step look-ahead reward (eq. 6; l = 1 by default), or a UCT Monte Carlo tree
  search over the same candidates with a simulation budget (``search = "mcts"``);
* the task is picked by a softmax over values with temperature tau (eq. 7; tau = 0 is the greedy,
  "hard" choice) and learned for real by every method.

Look-ahead tasks are drawn from the step's own search space (the candidates disjoint from the one
being valued), not re-sampled from the pool at every node: re-running stage A inside the tree would
multiply the cost by the tree size. The first task is K uniformly drawn classes, fixed per seed for
every strategy (appendix B.3), so strategies start from the same state.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ... import metrics
from ...method import Diverged, Experience, Method, MethodError
from ...state_guard import unchanged
from . import clustering, sampling
from .pool import DataPool

SEARCHES = ("lookahead", "mcts", "most-similar", "random")
# Bump when the sequences a search finds change (part of the search record's key). 2: alg. 1 line 4
# normalises over the candidate classes only; ablation (d) compares with all previous tasks (issue 15).
SEARCH_VERSION = 2
SAMPLINGS = ("greedy", "uniform")


@dataclass
class SearchConfig:
    classes_per_task: int = 20      # K (appendix B.3: 20-class tasks)
    steps: int = 10                 # N (appendix B.3: 10 tasks)
    candidates: int = 30            # |T_(g)^t|: tasks from greedy sampling (alg. 1's J)
    search_space: int = 5           # |T^t|: tasks kept by clustering (alg. 2's J)
    clusters: int = 3               # k-means clusters (alg. 2 line 10)
    knn_k: int = 5                  # neighbours of the k-NN classifiers (alg. 2 line 5)
    lookahead: int = 1              # l of eq. 6
    lookahead_width: int = 0        # next-step candidates tried per node (0: all of the search space)
    search: str = "lookahead"       # SEARCHES; "most-similar"/"random": figure 7 ablations (d)/(a)
    sampling: str = "greedy"        # SAMPLINGS; "uniform": figure 7 ablation (b)
    clustering: bool = True         # False: figure 7 ablation (c), a uniform draw from the candidates
    simulations: int = 0            # MCTS budget (0: 4 x search_space)
    uct_c: float = 1.0              # UCT exploration constant
    discount: float = 1.0           # alpha of eq. 5 on look-ahead rewards
    temperature: float = 0.0        # tau of eq. 7
    batch_size: int = 32
    eval_batch_size: int = 512


@dataclass
class State:
    """F^{t}: the methods after the tasks so far, with their validation-accuracy diagonals R[j, j]."""
    methods: list[Method]
    diags: list[list[float]]
    tasks: list[list[str]]

    @property
    def used(self) -> set[str]:
        return {c for task in self.tasks for c in task}


@dataclass
class StepLog:
    step: int
    classes: list[str]
    candidates: list[dict] = field(default_factory=list)
    chosen: int = 0
    timings: dict = field(default_factory=dict)
    accuracies: list[list[float]] = field(default_factory=list)   # per model: val acc of every task so far


class SearchError(ValueError):
    """A search that cannot run with what it was given."""


@contextlib.contextmanager
def eval_mode(method: Method):
    """Every module the method holds in eval mode (and no grad) for probing; restored after."""
    modules = [m for v in vars(method).values() for m in ([v] if isinstance(v, nn.Module) else [])]
    flags = [[sub.training for sub in m.modules()] for m in modules]
    for m in modules:
        m.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, fl in zip(modules, flags):
            for sub, f in zip(m.modules(), fl):
                sub.training = f


def features(method: Method, x: torch.Tensor) -> torch.Tensor:
    """``method.features(x)``; without one, the penultimate layer of the method's backbone
    (``self.backbone`` or ``self.model.backbone``)."""
    try:
        return method.features(x)
    except MethodError as exc:
        for backbone in (getattr(method, "backbone", None), getattr(getattr(method, "model", None), "backbone", None)):
            if isinstance(backbone, nn.Module):
                return backbone(x)
        raise SearchError(f"method {method.name!r} gives no features for CLDyB prototypes: its features() failed "
                          f"({exc}) and it holds no backbone to fall back on (self.backbone or self.model.backbone). "
                          "Define features(x) returning penultimate-layer features.") from None


def probe_features(methods: Sequence[Method], data) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every model's features of every probe sample, and the samples' labels."""
    labels = torch.cat([y for _, y in data.batches(4096)])
    out = []
    for method in methods:
        with eval_mode(method):
            out.append(torch.cat([features(method, x).flatten(1).float() for x, _ in data.batches(512)]))
    return out, labels


def prototypes(feats: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class means mu_{m,p} (eq. 3) from one model's probe features."""
    sums = torch.zeros(num_classes, feats.shape[1], device=feats.device).index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=num_classes).clamp_min(1).to(feats.dtype)
    return sums / counts[:, None]


def select(values: Sequence[float], temperature: float, rng: np.random.Generator) -> int:
    """Eq. 7: softmax over candidate values at temperature tau; tau = 0 is the argmax."""
    v = np.asarray(values, dtype=float)
    if temperature <= 0:
        return int(np.argmax(v))
    z = (v - v.max()) / temperature
    p = np.exp(z) / np.exp(z).sum()
    return int(rng.choice(len(v), p=p))


class Search:
    """One CLDyB search: ``run()`` yields the steps of a sequence and leaves the methods trained on it."""

    # Where the look-ahead candidates are valued: None = here, one after the other; else a callable
    # (search, tasks) -> (values, rewards) that runs ``value_candidate`` for every candidate elsewhere
    # (clharness.engine.ray_backend sets one under --clh-ray: one Ray task per candidate, same arithmetic).
    fan_out: Callable | None = None
    # What marks the search's evaluation (validation accuracies, probe features) for its FLOP count: the session's
    # ``counted`` hands one (kinds.FamilySession); everything else the search runs (its methods' learning) is training.
    evaluating: Callable = contextlib.nullcontext

    def __init__(self, pool: DataPool, methods: Sequence[Method], config: SearchConfig, seed: int,
                 device: torch.device, grow: Callable[[int], list[str]] | None = None):
        self.pool, self.cfg, self.seed, self.device = pool, config, seed, torch.device(device)
        self.grow = grow or (lambda step: [])
        self.state = State(list(methods), [[] for _ in methods], [])
        self.num_classes = config.classes_per_task * config.steps
        self.rng = np.random.default_rng([seed, 1])
        if config.search not in SEARCHES:
            raise SearchError(f"search = {config.search!r}; allowed: {', '.join(SEARCHES)}")
        if config.sampling not in SAMPLINGS:
            raise SearchError(f"sampling = {config.sampling!r}; allowed: {', '.join(SAMPLINGS)}")
        if config.search != "random" and not methods:
            raise SearchError(f"search = {config.search!r} needs at least one method to search with")
        for m in methods:
            if m.context.num_classes < self.num_classes:
                raise SearchError(f"method {m.name!r} was built for {m.context.num_classes} classes; the sequence "
                                  f"has {self.num_classes} (steps x classes_per_task)")
        self._val_cache: dict[tuple, object] = {}

    # ------------------------------------------------------------------ one transition
    def experience(self, names: Sequence[str], step: int) -> Experience:
        K = self.cfg.classes_per_task
        return Experience(data=self.pool.data(names, "train", first_label=step * K),
                          classes=tuple(range(step * K, (step + 1) * K)), task_id=None,
                          batch_size=self.cfg.batch_size, seed=self.seed * 1000 + step)

    def _val(self, tasks: list[list[str]]):
        key = tuple(c for t in tasks for c in t)
        if key not in self._val_cache:
            if len(self._val_cache) > 64:
                self._val_cache.clear()
            self._val_cache[key] = self.pool.data(list(key), "val")
        return self._val_cache[key]

    def task_accuracies(self, method: Method, tasks: list[list[str]]) -> np.ndarray:
        """Validation accuracy of ``method`` on each task so far (labels t*K + position: task = y // K)."""
        with self.evaluating():
            return self._task_accuracies(method, tasks)

    @torch.no_grad()
    def _task_accuracies(self, method: Method, tasks: list[list[str]]) -> np.ndarray:
        K, T = self.cfg.classes_per_task, len(tasks)
        correct = torch.zeros(T, device=self.device)
        total = torch.zeros(T, device=self.device)
        for x, y in self._val(tasks).batches(self.cfg.eval_batch_size):
            with unchanged(method):   # the look-ahead's evaluation never changes a method either
                logits = method.predict(x)
            if not isinstance(logits, torch.Tensor) or logits.shape != (len(x), method.context.num_classes):
                raise MethodError(f"method {method.name!r}: predict() returned "
                                  f"{getattr(logits, 'shape', type(logits).__name__)}; expected "
                                  f"({len(x)}, {method.context.num_classes})")
            if not torch.isfinite(logits).all():
                raise Diverged(f"method {method.name!r}: non-finite logits during the CLDyB search")
            task = torch.div(y, K, rounding_mode="floor")
            correct.index_add_(0, task, (logits.argmax(1) == y).float())
            total.index_add_(0, task, torch.ones_like(task, dtype=torch.float))
        return (correct / total.clamp_min(1)).cpu().numpy()

    def transition(self, state: State, names: list[str], copy: bool = True) -> tuple[State, float, list]:
        """F^{t-1} --T--> F^t: every method learns T (copies when ``copy``); returns the new state, the
        immediate reward R = AFM - ALA averaged over the M models (eqs. 1, 2, 5) and the accuracy rows."""
        step = len(state.tasks)
        tasks = state.tasks + [list(names)]
        methods, diags, rows, rewards = [], [], [], []
        for method, diag in zip(state.methods, state.diags):
            learner = method.clone() if copy else method
            learner.learn(self.experience(names, step))
            row = self.task_accuracies(learner, tasks)
            R = np.full((step + 1, step + 1), np.nan)
            R[np.arange(step), np.arange(step)] = diag
            R[step] = row
            rewards.append(metrics.afm(R) - metrics.ala(R))
            methods.append(learner)
            diags.append(diag + [float(row[step])])
            rows.append(row.tolist())
        return State(methods, diags, tasks), float(np.mean(rewards)) if rewards else 0.0, rows

    # ------------------------------------------------------------------ stage A
    def propose(self, timings: dict) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray | None]:
        """Candidates for this step: (J x K) positions into ``names``, the names, cluster labels, and
        the potential matrix over the candidate classes ``names`` (None where it was not needed)."""
        cfg, pool = self.cfg, self.pool
        names = pool.available()
        sampling.check_task_counts(len(names), cfg.classes_per_task, cfg.candidates)
        psi, feats, labels = None, None, None
        t0 = time.perf_counter()
        need_feats = cfg.sampling == "greedy" or cfg.clustering or cfg.search == "most-similar"
        # ablation (d): the classes of every previously encountered task, not only the last one
        previous = [c for task in self.state.tasks for c in task] if cfg.search == "most-similar" else []
        probe_names = names + previous
        if need_feats:
            data = pool.data(probe_names, "train", limit=pool.probe_per_class)
            with self.evaluating():
                feats, labels = probe_features(self.state.methods, data)
            protos = [prototypes(f, labels, len(probe_names)) for f in feats]
            _sync(self.device)
        t1 = time.perf_counter()
        if cfg.sampling == "greedy":   # alg. 1 line 4: Psi and its z() range over p, q in C = D \ C^{<t} only
            psi = sampling.potentials([p[:len(names)] for p in protos])
            tasks = sampling.greedy_tasks(psi, cfg.classes_per_task, cfg.candidates, self.rng)
        else:
            groups = {}
            for i, n in enumerate(names):
                groups.setdefault(n.split("/", 1)[0], []).append(i)
            tasks = sampling.uniform_tasks(list(groups.values()), cfg.classes_per_task, cfg.candidates, self.rng)
        tasks = sampling.unique_tasks(tasks)
        _sync(self.device)
        t2 = time.perf_counter()
        if cfg.clustering and len(tasks) > 1:
            keep = labels < len(names)
            G = clustering.functional_vectors(tasks, [f[keep] for f in feats], labels[keep], cfg.knn_k)
            clusters = clustering.cluster_tasks(G, cfg.clusters, int(self.rng.integers(2**31)))
            picked = clustering.ancestral_sample(clusters, cfg.search_space, self.rng)
        else:   # ablation (c): uniform draw from the candidates
            clusters = np.zeros(len(tasks), dtype=np.int64)
            picked = list(self.rng.permutation(len(tasks))[:cfg.search_space])
        t3 = time.perf_counter()
        timings.update(prototypes=t1 - t0, sampling=t2 - t1, clustering=t3 - t2)
        prev_pos = list(range(len(names), len(probe_names)))
        self._similarity = (sampling.task_similarity(sampling.potentials(protos), tasks[picked], prev_pos)
                            if cfg.search == "most-similar" and prev_pos else None)
        return tasks[picked], names, clusters[picked], psi

    # ------------------------------------------------------------------ stage B
    def value_lookahead(self, tasks: list[list[str]]) -> tuple[list[float], list[float]]:
        """Eq. 6: immediate reward + the best l-step continuation, for every candidate."""
        if self.fan_out is not None:
            return self.fan_out(self, tasks)
        values, rewards = [], []
        for names in tasks:
            value, r = self.value_candidate(tasks, names)
            values.append(value)
            rewards.append(r)
        return values, rewards

    def value_candidate(self, tasks: list[list[str]], names: list[str]) -> tuple[float, float]:
        """Eq. 6 for one candidate: (immediate reward + best continuation, immediate reward). Depends only
        on the current state, so candidates can be valued in any order or in parallel."""
        child, r, _ = self.transition(self.state, names)
        return r + self._continuation(child, tasks, self.cfg.lookahead), r

    def _continuation(self, state: State, tasks: list[list[str]], depth: int) -> float:
        if depth <= 0 or len(state.tasks) >= self.cfg.steps:   # no look-ahead past the sequence's end
            return 0.0
        used = state.used
        nxt = [t for t in tasks if used.isdisjoint(t)]
        if self.cfg.lookahead_width:
            nxt = nxt[:self.cfg.lookahead_width]
        if not nxt:
            return 0.0
        best = -math.inf
        for names in nxt:
            child, r, _ = self.transition(state, names)
            best = max(best, r + self._continuation(child, tasks, depth - 1))
        return self.cfg.discount * best

    def value_mcts(self, tasks: list[list[str]]) -> tuple[list[float], list[float]]:
        """UCT over the search space, paths of at most l+1 tasks (eq. 6's horizon); a node's value is
        the mean discounted return of the simulations through it; every root action is tried first."""
        cfg = self.cfg
        root = _Node(self.state, 0.0)
        budget = cfg.simulations or 4 * len(tasks)
        for _ in range(max(budget, len(tasks))):
            node, path = root, []
            while len(path) < cfg.lookahead + 1 and len(node.state.tasks) < cfg.steps:
                used = node.state.used
                actions = [a for a, t in enumerate(tasks) if used.isdisjoint(t)]
                if not actions:
                    break
                untried = [a for a in actions if a not in node.children]
                if untried:
                    a = untried[0] if node is root else untried[int(self.rng.integers(len(untried)))]
                    state, r, _ = self.transition(node.state, tasks[a])
                    node.children[a] = child = _Node(state, r)
                    path.append(child)
                    break
                log_n = math.log(max(node.n, 1))
                a = max(actions, key=lambda a: node.children[a].q + cfg.uct_c * math.sqrt(log_n / node.children[a].n))
                node = node.children[a]
                path.append(node)
            ret = 0.0
            for n in reversed(path):
                ret = n.reward + cfg.discount * ret
                n.n += 1
                n.w += ret
            root.n += 1
        values = [root.children[a].q for a in range(len(tasks))]
        self.visits = [root.children[a].n for a in range(len(tasks))]
        return values, [root.children[a].reward for a in range(len(tasks))]

    # ------------------------------------------------------------------ the sequence
    def first_task(self) -> list[str]:
        """Appendix B.3: the first task is random and fixed per seed (same for every strategy)."""
        names = self.pool.available()
        sampling.check_task_counts(len(names), self.cfg.classes_per_task, 1)
        rng = np.random.default_rng([self.seed, 0])
        return [names[i] for i in sorted(rng.choice(len(names), self.cfg.classes_per_task, replace=False))]

    def run(self):
        cfg = self.cfg
        for step in range(cfg.steps):
            timings = {"prototypes": 0.0, "sampling": 0.0, "clustering": 0.0, "lookahead": 0.0, "learn": 0.0}
            added = self.grow(step)
            log = StepLog(step, [])
            if added:
                timings["pool_added"] = len(added)
            if step == 0 or cfg.search == "random":
                if step == 0:
                    chosen_names = self.first_task()
                else:
                    names = self.pool.available()
                    sampling.check_task_counts(len(names), cfg.classes_per_task, 1)
                    chosen_names = [names[i] for i in sorted(self.rng.choice(len(names), cfg.classes_per_task,
                                                                               replace=False))]
                log.candidates = [{"classes": chosen_names, "value": None, "reward": None, "cluster": None}]
            else:
                tasks, names, clusters, _ = self.propose(timings)
                named = [[names[i] for i in row] for row in tasks]
                t0 = time.perf_counter()
                if cfg.search == "most-similar":   # ablation (d): the task most similar to all previous ones
                    values, rewards = self._similarity.tolist(), [None] * len(named)
                elif cfg.search == "mcts":
                    values, rewards = self.value_mcts(named)
                else:
                    values, rewards = self.value_lookahead(named)
                timings["lookahead"] = time.perf_counter() - t0
                log.chosen = select(values, cfg.temperature, self.rng)
                chosen_names = named[log.chosen]
                log.candidates = [{"classes": n, "value": v, "reward": r, "cluster": int(c)}
                                  for n, v, r, c in zip(named, values, rewards, clusters)]
                if cfg.search == "mcts":   # simulations through each root action
                    for cand, n in zip(log.candidates, self.visits):
                        cand["visits"] = n
            t0 = time.perf_counter()
            self.pool.take(chosen_names)
            self.state, _, rows = self.transition(self.state, chosen_names, copy=False)   # learned for real
            timings["learn"] = time.perf_counter() - t0
            log.classes, log.timings, log.accuracies = chosen_names, timings, rows
            yield log


class _Node:
    __slots__ = ("state", "reward", "children", "n", "w")

    def __init__(self, state: State, reward: float):
        self.state, self.reward, self.children, self.n, self.w = state, reward, {}, 0, 0.0

    @property
    def q(self) -> float:
        return self.w / self.n if self.n else -math.inf


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
