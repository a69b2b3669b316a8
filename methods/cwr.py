"""CWR* (Lomonaco, Maltoni & Pellegrini 2020, "Rehearsal-free continual learning over small non-i.i.d.
batches", CVPR Workshops, Algorithm 1; the authors' code in Avalanche ``CWRStarPlugin``): copy weight with
re-init, consolidated output weights per class."""
import torch

from clharness.toolkit.training import SupervisedMethod, optimizer_space


class CWRStar(SupervisedMethod):
    """The whole network is trained on the first task; afterwards the feature extractor is frozen
    (eval mode, as the M2I paper's implementation freezes the layers below the CWR layer) and only the
    output layer learns. Before each task the output layer is re-initialised: zero for every class,
    the consolidated weights cw for the task's classes. After it, for each class j of the task,
    with cur_j its training samples and past_j those of earlier tasks:
        w_past = sqrt(past_j / cur_j)
        cw[j] = (cw[j] * w_past + (tw[j] - mean_k tw[k])) / (w_past + 1),   past_j += cur_j
    where mean_k tw[k] is one scalar: the average of every entry of the task's classes' weight rows
    (the reference's ``np.average(weight[cur_class])``). The consolidated weights are used at test
    time. Only the weight is re-initialised and consolidated: the head's bias is an ordinary trained
    parameter, never reset (the reference touches ``weight`` only)."""
    name = "cwr"
    version = "2"   # 2: scalar mean of the task's weights, bias neither reset nor consolidated (issue 28)
    paper = ("Lomonaco, Maltoni & Pellegrini, Rehearsal-Free Continual Learning over Small Non-I.I.D. "
             "Batches, CVPR Workshops 2020")
    reference = "ContinualAI/avalanche: avalanche/training/plugins/cwr_star.py"
    deviations = (
        "none from the reference: past_j counts every visit of class j, the first included (Algorithm 1), "
        "as Avalanche's cwr_star.py:82-92 does (past_j = cur_j on a class's first visit, the weighted "
        "average on later ones); Avalanche 0.2.1's plugin left past_j at 0 on the first visit, so a "
        "class's second visit overwrote its consolidated weights",)
    hparams = optimizer_space(lr=0.01, momentum=0.9)

    def __init__(self, context, **hparams):
        super().__init__(context, **hparams)
        head = self.model.head
        self.cw_weight = torch.zeros_like(head.weight.detach())
        self.past = torch.zeros(context.num_classes, device=context.device)
        self.tasks_seen = 0

    def learn(self, experience):
        self.labels.add(experience)
        classes = torch.tensor(experience.classes, device=self.context.device)
        head = self.model.head
        with torch.no_grad():   # tw = 0, then the consolidated weights of this task's classes (bias kept)
            head.weight.zero_()
            head.weight[classes] = self.cw_weight[classes]
        frozen = self.tasks_seen > 0
        self.model.backbone.requires_grad_(not frozen)
        params = self.model.head.parameters() if frozen else self.model.parameters()
        batches = experience.batches(epochs=self.context.epochs)
        if frozen:
            self.fit(batches, params=list(params), loss_fn=self._frozen_loss)
        else:
            self.fit(batches, params=list(params))
        self.consolidate_classes(classes, self._class_counts(experience, classes))
        self.tasks_seen += 1

    def _frozen_loss(self, x, y):
        self.model.backbone.eval()   # frozen extractor: fixed BN statistics
        return self.loss(x, y)

    @staticmethod
    def _class_counts(experience, classes):
        labels = experience.data.labels.to(classes.device)
        return (labels[None, :] == classes[:, None]).sum(1).float()

    @torch.no_grad()
    def consolidate_classes(self, classes, cur):
        head = self.model.head
        tw = head.weight[classes]
        w_past = (self.past[classes] / cur.clamp_min(1)).sqrt()[:, None]
        self.cw_weight[classes] = (self.cw_weight[classes] * w_past + (tw - tw.mean())) / (w_past + 1)
        self.past[classes] += cur
        head.weight.copy_(self.cw_weight)   # test with the consolidated weights
