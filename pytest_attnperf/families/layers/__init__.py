"""Whole layers for the model ladder: an attention layer and a Gated DeltaNet layer, with their cost models."""
