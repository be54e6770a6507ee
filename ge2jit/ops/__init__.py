"""Ops: each one owns its folder here and its templates under kernel_templates/<op>/."""
