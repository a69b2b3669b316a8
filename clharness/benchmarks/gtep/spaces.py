"""The GTEP paper's search spaces, by our method and hyperparameter names: appendix A.1 Table 4
(class-IL without a pretrained model, ``general = "table4"``) and A.2 Table 5 (with a pretrained
ViT, ``general = "table5"``). ``protocol.method_space`` searches exactly these for the methods the
paper covers (suite option ``spaces = "paper"``, the default); ``spaces = "method"`` searches each
method's own ``tuning_space`` / declared hyperparameters instead (the harness's generic reading).

Readings where the tables are not literal (declared here and in each suite file):
- Table 4's "lambda (Aux)" of PODNet is our ``lambda_f`` (PyCIL's ``lambda_f_base``, the
  POD-spatial weight): every PODNet ``lambda_f`` of appendix A.1 (0.5, 1, 1.5, 3) lies in its set.
  The appendix also varies ``lambda_c`` (1, 3, 7, 9), a set Table 4 does not print; it stays at its
  default (5) here. To search it too, give the suite
  ``search.podnet = { lambda_c = [1, 3, 5, 7, 9], ... }`` with PODNet's other own sets.
- Table 5 gives the prompt-based methods (L2P, DualPrompt, CODA-Prompt) their own column of
  epochs, lr and weight decay (``PROMPT_COLUMN``); the representation-based ones take the other
  column (``clharness.hparams.TABLE5``). Its batch-size set is printed "for L2P, DualPrompt,
  CODA-Prompt, Adam-Adapter", yet the appendix's Ranpac and EASE configurations take batch sizes
  8, 24, 64 and 128 from that set: every method samples it.
- Table 4's MEMO "Exemplar batch size" is PyCIL ``memo.py``'s ``batch_size = 64``, the batch size of
  the herding feature-extraction loaders (eval mode), our ``exemplar_batch_size``; it is not the
  training batch. Table 5's "M Size" of DualPrompt is the code's E-prompt pool size ``--size``
  (PILOT ``exps/dualprompt.json`` ``size``), our ``pool_size`` (0, the default outside the search,
  grows the pool by one per task).
- Cells with no counterpart here would be listed in ``NO_COUNTERPART`` (not searched); none is.
"""
from __future__ import annotations

KD_T = [0.5, 1.0, 1.5, 2.0, 2.5]           # T (KD)
KD_LAMBDA = [0.5, 1.0, 1.5, 2.0, 3.0]      # lambda (KD), lambda (Aux), lambda (FE)

# Table 5's column for L2P, DualPrompt and CODA-Prompt
PROMPT_COLUMN = {"epochs": [3, 5, 10, 15, 20, 25],
                 "lr": [0.000875, 0.001375, 0.001875, 0.002375, 0.0025],
                 "weight_decay": [0, 0.0001, 0.0005]}

# general table -> our method -> its own sets (in the order they are drawn)
PAPER_SPACES: dict[str, dict[str, dict[str, list]]] = {
    "table4": {
        "er": {},                                                   # Replay: the general sets only
        "icarl": {"temperature": KD_T, "kd_lambda": KD_LAMBDA},     # T (KD), lambda (Aux)
        "bic": {"temperature": KD_T, "kd_lambda": KD_LAMBDA, "split_ratio": [0.05, 0.1, 0.15, 0.2, 0.3]},
        "wa": {"temperature": KD_T, "kd_lambda": KD_LAMBDA},
        "podnet": {"proxies": [10, 20, 30, 50, 100], "finetune_epochs": [5, 10, 20, 30, 50],
                   "finetune_lr": [0.001, 0.003, 0.005, 0.007, 0.01], "adaptive_factor": [True, False],
                   "lambda_f": KD_LAMBDA},                          # lambda (Aux): see the module note
        "der": {"aux_weight": KD_LAMBDA},
        "memo": {"aux_weight": KD_LAMBDA,
                 "exemplar_batch_size": [16, 32, 64, 128, 256]},    # PyCIL memo.py's herding batch_size
        "foster": {"temperature": KD_T, "kd_weight": KD_LAMBDA, "fe_weight": KD_LAMBDA,
                   "beta1": [0.93, 0.95, 0.97, 0.99], "beta2": [0.93, 0.95, 0.97, 0.99],
                   "compression_epochs": [30, 70, 120, 160, 200]},
        "beef": {"energy_weight": [0.001, 0.005, 0.01, 0.02, 0.05], "logits_alignment": [1.1, 1.4, 1.7, 2.0, 2.3],
                 "fusion_epochs": [30, 70, 120, 160, 200]},
    },
    "table5": {
        "l2p": {"pool_size": [10, 15, 20, 25, 30], "prompt_length": [2, 4, 6, 8, 10], "top_n": [2, 4, 6, 8, 10],
                "pull_lambda": [0.1, 0.3, 0.5]},
        "dualprompt": {"pool_size": [10, 15, 20, 25, 30],          # M Size: the code's --size (E-prompt pool)
                       "g_length": [5, 10, 15, 20, 30], "e_length": [5, 10, 15, 20, 30], "pull_lambda": [0.1, 0.3, 0.5]},
        "coda_prompt": {"pool_size": [30, 50, 100, 200, 300], "prompt_length": [4, 8, 16, 24, 32],
                        "ortho_mu": [0.2, 0.1, 0.01, 0.001, 0.0]},
        "aper": {"ffn_num": [4, 8, 16, 32, 64]},                    # Adam-Adapter
        "ranpac": {"projection_dim": [5000, 10000, 15000, 20000], "ffn_num": [4, 8, 16, 32, 64],
                   "prompt_tokens": [3, 5, 10, 20, 30, 50]},
        "ease": {"ffn_num": [4, 8, 16, 32, 64], "alpha": [0.01, 0.05, 0.1, 0.15, 0.2]},
    },
}

# general table -> our method -> general sets replacing the table's (Table 5's prompt column)
GENERAL_COLUMNS: dict[str, dict[str, dict[str, list]]] = {
    "table4": {},
    "table5": {"l2p": PROMPT_COLUMN, "dualprompt": PROMPT_COLUMN, "coda_prompt": PROMPT_COLUMN},
}

# (our method, the paper's hyperparameter name) -> why it is not searched here
# (none left: MEMO's "Exemplar batch size" is its exemplar_batch_size, DualPrompt's "M Size" its pool_size)
NO_COUNTERPART: dict[tuple[str, str], str] = {}

SPACES = ("paper", "method")


def paper_space(general: str, method: str) -> tuple[dict[str, list], dict[str, list]] | None:
    """(own sets, general-set overrides) of ``method`` under ``general``'s table, None when the
    paper's table does not cover it."""
    own = PAPER_SPACES.get(general, {}).get(method)
    if own is None:
        return None
    return dict(own), dict(GENERAL_COLUMNS.get(general, {}).get(method, {}))
