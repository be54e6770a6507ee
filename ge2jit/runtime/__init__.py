"""The op-agnostic runtime above ``ge2jit/jit/``: element types and the argument checks every op
shares. (No op is named here.)"""
