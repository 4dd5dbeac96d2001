"""Flower's quickstart-pytorch app on offline MNIST (2 label shards per node)."""
