"""Dynamo configuration."""

cache_size_limit = 8
accumulated_cache_size_limit = 256
suppress_errors = False
assume_static_by_default = True
automatic_dynamic_shapes = True
