"""Splitting a model across ranks: where a family keeps its blocks, pipeline stand-ins, tensor
sharding, the shape checks of a split, and the probe (with its wording) that answers whether a
layout works before anything loads.
"""
