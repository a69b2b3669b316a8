"""What a method author builds with: backbones, replay buffers, exemplar selection, dynamic
expansion, gradient projection, ViT adapters and prompts, the feature cache, training loops and
augmentation recipes. Depends on the contract (``clharness.method``, ``hparams``, ``registry``) only.
"""
