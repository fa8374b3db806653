"""The compiler: IR graphs to NPU programs.

``compile_model(graph, config)`` simplifies the graph, cuts it into units (one
anchor operator with its epilogue, or the merged units the adaptive runtime
asks for), places tensors in DRAM and the scratchpad, lowers every operator to
instructions with dependency tokens, wraps each unit in region marks and links
them into one program. See docs/compiler.md.
"""

from .compile import compile_model
from .plan import CompileError, initial_units, simplify
from .program import CompiledModel

__all__ = ["CompileError", "CompiledModel", "compile_model", "initial_units", "simplify"]
