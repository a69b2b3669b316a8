"""The curricula's task names in learning order, and how the authors' shared head joins class names.
A module of constants so the kind, the effect statistics and the report read one definition
without importing each other (kind -> report_html -> effect must not lead back to kind)."""
from __future__ import annotations

M2I_ORDER = ("mnist", "omniglot", "fashion-mnist", "svhn", "cifar10", "tinyimagenet")   # easiest first
CURRICULA = {"m2i": M2I_ORDER, "i2m": tuple(reversed(M2I_ORDER))}
SHARED_SEP = " | "   # the shared head's class names: "mnist/0 | omniglot/... | tinyimagenet/..."
