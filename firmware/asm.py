"""Assembler and disassembler for the NPU ISA.

Syntax, one instruction per line::

    ; comments start with ';' or '#'
    .equ   ROWS, 16            ; named constant (expressions allowed: ROWS*4+1)
    .reg   act, r3             ; named register
    start:                     ; label: the index of the next instruction
        li      act, 0x100
        load    p0, act, r1, r0, ROWS, 64, tag=2, push=next
        gemm.accumulate p1, r2, r4, 16, swap=1, pop=prev|next
        br.lt   r5, r6, start
        .word   0x0400000000000000   ; raw word (tests of illegal encodings)

Operands are positional in the order the ISA lists them; optional operands (those
with a default) may also be given as ``name=value``, and so may any other. Fields
marked as suffix are written after a dot (``br.eq``, ``cfg.qmul``, ``region.begin``).
Dependency tokens are ``pop=prev|next`` and ``push=prev|next``. Pseudo-instructions:
``jmp label`` (``br.always r0, r0, label``) and ``mov rd, rs`` (``addi rd, rs, 0``).
"""

from __future__ import annotations

import ast
import operator
import re
import threading
from dataclasses import dataclass, field

from . import isa
from .isa import Instr, Kind, Token


class AsmError(ValueError):
    """An assembly error, with the source line it happened on."""

    def __init__(self, message: str, line: int | None = None, text: str = ""):
        where = f"line {line}: " if line is not None else ""
        detail = f"\n    {text.strip()}" if text else ""
        super().__init__(f"{where}{message}{detail}")
        self.line = line


@dataclass
class Program:
    """An assembled program: instruction words plus what the tools need to read them."""

    words: list[int]
    symbols: dict[str, int] = field(default_factory=dict)  # label -> instruction index
    lines: list[int] = field(default_factory=list)  # source line of each word
    source: str = ""

    def __len__(self):
        return len(self.words)

    def instrs(self) -> list[Instr]:
        """Decode every word (raises isa.DecodeError on an illegal one)."""
        return [isa.decode(w) for w in self.words]

    def to_bytes(self) -> bytes:
        """Little-endian image, 8 bytes per instruction (what the host writes)."""
        return b"".join(w.to_bytes(8, "little") for w in self.words)

    @classmethod
    def from_bytes(cls, data: bytes) -> Program:
        if len(data) % 8:
            raise ValueError(f"program image of {len(data)} bytes is not a multiple of 8")
        words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]
        return cls(words)


_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_MAX_BITS = 4096  # wider than any field: bounds what a hostile expression can build
_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.LShift: operator.lshift,
    ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitAnd: operator.and_,
}


# Some CPython 3.11 releases (3.11.2, which CI runs, among them) keep the AST
# constructor's recursion depth in state that all threads share, so two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905). The runtime compiles in background threads, so
# parses take turns.
_PARSE_LOCK = threading.Lock()


def _eval(expr: str, names: dict[str, int]) -> int:
    """Evaluate an integer expression with names, without Python's eval."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise AsmError(f"undefined symbol {node.id!r}")
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.LShift) and right > _MAX_BITS:
                raise AsmError(f"shift by {right} in {expr!r} (values are at most "
                               f"{_MAX_BITS} bits)")
            value = _BINOPS[type(node.op)](left, right)
            if value.bit_length() > _MAX_BITS:
                raise AsmError(f"{expr!r} is wider than {_MAX_BITS} bits")
            return value
        raise AsmError(f"cannot evaluate {expr!r}")

    try:
        with _PARSE_LOCK:
            tree = ast.parse(expr.strip(), mode="eval")
        return ev(tree.body)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        if isinstance(err, AsmError):
            raise
        raise AsmError(f"bad expression {expr!r}") from None
    except ArithmeticError as err:  # division by zero
        raise AsmError(f"cannot evaluate {expr!r}: {err}") from None


_LABEL = re.compile(r"^([A-Za-z_][\w.]*)\s*:\s*(.*)$")
_REG = re.compile(r"^r(\d+)$")
_PART = re.compile(r"^p(\d+)$")
_TOKEN_NAMES = {
    "pop": {"prev": Token.POP_PREV, "next": Token.POP_NEXT},
    "push": {"prev": Token.PUSH_PREV, "next": Token.PUSH_NEXT},
}


# Pseudo-instructions: name -> rewrite of (operand text) to (mnemonic, operand text).
_PSEUDO = {
    "jmp": lambda rest: ("br.always", f"r0, r0, {rest}"),
    "mov": lambda rest: ("addi", f"{rest}, 0"),
}


def _strip_comment(line: str) -> str:
    return re.split(r"[;#]", line, maxsplit=1)[0].strip()


def _head(text: str) -> tuple[str, str]:
    """The mnemonic (or directive) and the operand text after any whitespace."""
    head, *rest = text.split(None, 1)
    return head, rest[0] if rest else ""


def _split_operands(text: str) -> list[str]:
    return [t.strip() for t in text.split(",")] if text.strip() else []


class _Assembler:
    def __init__(self, source: str, defines: dict[str, int] | None):
        self.source = source
        self.consts: dict[str, int] = dict(defines or {})
        self.regs: dict[str, int] = {"zero": 0}
        self.labels: dict[str, int] = {}

    def run(self) -> Program:
        body = []  # (line number, text) of instruction lines, after pass 1
        pc = 0
        for no, raw in enumerate(self.source.splitlines(), start=1):
            text = _strip_comment(raw)
            while (m := _LABEL.match(text)) and not text.startswith("."):
                name = m.group(1)
                if name in self.labels or name in self.consts:
                    raise AsmError(f"symbol {name!r} defined twice", no, raw)
                self.labels[name] = pc
                text = m.group(2).strip()
            if not text:
                continue
            if text.startswith(".") and not text.startswith(".word"):
                self._directive(text, no, raw)
                continue
            body.append((no, raw, text))
            pc += 1
        words, lines = [], []
        for no, raw, text in body:
            try:
                words.append(self._line(text))
            except AsmError as e:
                if e.line is None:
                    raise AsmError(str(e), no, raw) from None
                raise
            except ValueError as e:
                raise AsmError(str(e), no, raw) from None
            lines.append(no)
        return Program(words, dict(self.labels), lines, self.source)

    def _directive(self, text, no, raw):
        name, rest = _head(text)
        args = _split_operands(rest)
        if name == ".equ" and len(args) == 2:
            try:
                self.consts[args[0]] = _eval(args[1], self.consts)
            except AsmError as e:
                raise AsmError(str(e), no, raw) from None
        elif name == ".reg" and len(args) == 2:
            m = _REG.match(args[1])
            if not m or int(m.group(1)) >= isa.NUM_REGS:
                raise AsmError(f"{args[1]!r} is not a register", no, raw)
            self.regs[args[0]] = int(m.group(1))
        else:
            raise AsmError(f"unknown or malformed directive {text!r}", no, raw)

    def _names(self):
        return {**self.consts, **self.labels}

    def _value(self, f: isa.Field, text: str) -> int:
        if f.kind is Kind.REG:
            if text in self.regs:
                return self.regs[text]
            m = _REG.match(text)
            if not m or int(m.group(1)) >= isa.NUM_REGS:
                raise AsmError(f"operand {f.name!r}: {text!r} is not a register")
            return int(m.group(1))
        if f.kind is Kind.PART:
            m = _PART.match(text)
            if not m:
                raise AsmError(f"operand {f.name!r}: {text!r} is not a partition (p0..p7)")
            return int(m.group(1))
        if f.kind is Kind.ENUM:
            try:
                return f.enum[text.upper()]
            except KeyError:
                choices = ", ".join(e.name.lower() for e in f.enum)
                raise AsmError(f"operand {f.name!r}: {text!r} is not one of {choices}") from None
        return _eval(text, self._names())

    def _line(self, text: str) -> int:
        if text.startswith(".word"):
            value = _eval(text[5:], self._names())
            if not 0 <= value < (1 << isa.WORD_BITS):
                raise AsmError(f".word value {value:#x} is not 64 bits")
            return value
        head, rest = _head(text)
        if head.lower() in _PSEUDO:
            head, rest = _PSEUDO[head.lower()](rest)
        mnemonic, _, suffix = head.lower().partition(".")
        spec = isa.BY_MNEMONIC.get(mnemonic)
        if spec is None:
            raise AsmError(f"unknown instruction {head!r}")
        ops: dict[str, int] = {}
        sfield = spec.suffix_field
        if sfield is not None:
            if not suffix:
                choices = ", ".join(f"{mnemonic}.{e.name.lower()}" for e in sfield.enum)
                raise AsmError(f"{mnemonic} needs a suffix: {choices}")
            ops[sfield.name] = self._value(sfield, suffix)
        elif suffix:
            raise AsmError(f"{mnemonic} takes no suffix ({head!r})")
        positional = [f for f in spec.fields if not f.suffix]
        tokens = Token(0)
        pos = 0
        for tok in _split_operands(rest):
            if not tok:
                raise AsmError("empty operand")
            key, eq, val = tok.partition("=")
            if eq:
                key, val = key.strip(), val.strip()
                if key in _TOKEN_NAMES:
                    for part in val.split("|"):
                        flag = _TOKEN_NAMES[key].get(part.strip())
                        if flag is None:
                            raise AsmError(f"token {key}={part!r}: use prev or next")
                        tokens |= flag
                    continue
                try:
                    f = spec.field(key)
                except KeyError:
                    raise AsmError(f"{mnemonic} has no operand {key!r}") from None
                if key in ops:
                    raise AsmError(f"operand {key!r} given twice")
                ops[key] = self._value(f, val)
            else:
                while pos < len(positional) and positional[pos].name in ops:
                    pos += 1
                if pos >= len(positional):
                    raise AsmError(f"too many operands for {mnemonic}")
                ops[positional[pos].name] = self._value(positional[pos], tok)
                pos += 1
        return isa.make(mnemonic, tokens, **ops).encode()


def assemble(source: str, defines: dict[str, int] | None = None) -> Program:
    """Assemble source text into a :class:`Program`; raises :class:`AsmError`."""
    return _Assembler(source, defines).run()


def assemble_file(path, defines: dict[str, int] | None = None) -> Program:
    with open(path) as f:
        return assemble(f.read(), defines)


def format_instr(instr: Instr, labels: dict[int, str] | None = None) -> str:
    """One instruction in canonical assembly (what :func:`assemble` reads back)."""
    spec = instr.spec
    head = spec.mnemonic
    if spec.suffix_field is not None:
        head += "." + instr.ops[spec.suffix_field.name].name.lower()
    parts = []
    for f in spec.fields:
        if f.suffix:
            continue
        v = instr.ops[f.name]
        if f.default is not None and v == f.default:
            continue
        if f.kind is Kind.REG:
            text = f"r{v}"
        elif f.kind is Kind.PART:
            text = f"p{v}"
        elif f.kind is Kind.TARGET and labels and v in labels:
            text = labels[v]
        elif f.kind is Kind.ENUM:
            text = v.name.lower()
        else:
            text = str(v)
        parts.append(f"{f.name}={text}" if f.default is not None else text)
    for key, flags in _TOKEN_NAMES.items():
        names = [n for n, flag in flags.items() if instr.tokens & flag]
        if names:
            parts.append(f"{key}={'|'.join(names)}")
    # At least one space between mnemonic and operands, however long the mnemonic.
    return f"{head:<15} {', '.join(parts)}".rstrip()


def disassemble(words, symbols: dict[str, int] | None = None, addresses: bool = False) -> str:
    """Disassemble words (or a Program) into source that assembles to the same words.

    Branch and loop targets get labels (the program's own where known, ``L<n>``
    otherwise). Words that do not decode become ``.word`` lines with a comment.
    """
    if isinstance(words, Program):
        symbols = symbols or words.symbols
        words = words.words
    end = len(words)
    # One label per index (the alphabetically first symbol wins); symbols past the
    # end cannot be placed on a line, so those targets stay numeric.
    labels = {
        v: k
        for k, v in sorted((symbols or {}).items(), key=lambda kv: kv[0], reverse=True)
        if 0 <= v <= end
    }
    decoded = []
    for w in words:
        try:
            decoded.append(isa.decode(w))
        except isa.DecodeError as e:
            decoded.append(e)
    for ins in decoded:
        if isinstance(ins, Instr):
            for f in ins.spec.fields:
                t = ins.ops[f.name]
                if f.kind is Kind.TARGET and t not in labels and t <= end:
                    labels[t] = f"L{t}"
    out = []
    for pc, (w, ins) in enumerate(zip(words, decoded, strict=True)):
        if pc in labels:
            out.append(f"{labels[pc]}:")
        prefix = f"    {pc:5d}:  " if addresses else "    "
        if isinstance(ins, Instr):
            out.append(prefix + format_instr(ins, labels))
        else:
            out.append(prefix + f".word {w:#018x}    ; illegal: {ins}")
    if end in labels:
        out.append(f"{labels[end]}:")
    return "\n".join(out) + "\n"
