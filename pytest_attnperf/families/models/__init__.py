"""Cases built from a model's config: its attention layers' shapes, split as tensor parallelism
splits them, run through the softmax and linear families (docs/models.md)."""
