"""Layout and import rules, checked on the real source (docs/architecture.md, "Packages").

vocabulary (stdlib only) ← engine (no SQL, no psycopg) ← postgres (the only
place SQL and psycopg live) ← composition (cli, supervisor, surface, metrics,
config, queue).
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "brooq"

ENGINE_FORBIDDEN = (
    "psycopg",
    "psycopg_pool",
    "brooq.postgres",
    "brooq.queue",
    "brooq.cli",
    "brooq.config",
    "brooq.supervisor",
    "brooq.surface",
    "brooq.metrics",
)
THIRD_PARTY = ("psycopg", "psycopg_pool", "prometheus_client", "yoyo")

# Upper-case SQL as written in statements, and the lower-case spellings that
# cannot be English prose.
SQL_RE = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
SQL_LOWER_RE = re.compile(
    r"\b(select\s+[\w*,\s.()]+\s+from\s+\w+|insert\s+into\s+\w+\s*\(|update\s+\w+\s+set\s+\w+\s*="
    r"|delete\s+from\s+\w+\s+where\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Import:
    """One imported module, where it is imported from."""

    module: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.module}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_imports(tree: ast.AST, path: Path, name: str) -> list[Import]:
    """Every module ``tree`` imports: top level, in functions, under TYPE_CHECKING, dynamic."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, path, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append(Import(module, path, node.lineno))
            # `from brooq import postgres` imports the submodule brooq.postgres
            found.extend(
                Import(f"{module}.{alias.name}", path, node.lineno)
                for alias in node.names
                if alias.name != "*"
            )
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            first = node.args[0]
            if (
                called in {"import_module", "__import__"}
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append(Import(first.value, path, node.lineno))
    return found


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def sources(under: Path | None = None) -> list[Path]:
    root = PACKAGE if under is None else under
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imports_under(sub: str) -> list[Import]:
    out: list[Import] = []
    for path in sources(PACKAGE / sub):
        out.extend(collect_imports(parse(path), path, module_name(path)))
    return out


def is_within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                ids.add(id(body[0].value))
        # attribute docstrings: a bare string right after an assignment
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for before, after in itertools.pairwise(stmts):
                if (
                    isinstance(before, ast.Assign | ast.AnnAssign)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    ids.add(id(after.value))
    return ids


def sql_strings(path: Path) -> list[str]:
    tree = parse(path)
    skip = docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and (SQL_RE.search(node.value) or SQL_LOWER_RE.search(node.value))
        ):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    return hits


# --- the checker checks what it claims to ---------------------------------------------------


def test_collector_sees_every_kind_of_import() -> None:
    code = """
import os, json as j
from datetime import timedelta
from . import sibling
from .. import vocabulary
from ..postgres.store import PostgresStore
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import psycopg_pool
def late():
    import psycopg
    from brooq import queue
class K:
    def m(self):
        importlib.import_module("prometheus_client")
        __import__("yoyo")
"""
    path = PACKAGE / "engine" / "example.py"
    found = {i.module for i in collect_imports(ast.parse(code), path, "brooq.engine.example")}
    assert {
        "os",
        "json",
        "datetime",
        "brooq.engine",
        "brooq.engine.sibling",
        "brooq",
        "brooq.vocabulary",
        "brooq.postgres.store",
        "psycopg_pool",
        "psycopg",
        "brooq.queue",
        "prometheus_client",
        "yoyo",
    } <= found


def test_sql_detector_finds_statements_and_spares_prose() -> None:
    for sql in [
        "SELECT id FROM job",
        "UPDATE job SET state = 'done'",
        "DELETE FROM job",
        "INSERT INTO job (id) VALUES (%s)",
        "update job set state = 'x'",
        "select id, topic from job where",
        "delete from job where id = 1",
    ]:
        assert SQL_RE.search(sql) or SQL_LOWER_RE.search(sql), sql
    for prose in [
        "select a topic",
        "delete the job from the queue",
        "update the settings",
        "insert into the queue",
        "jobs selected from a list",
        "Select one",
    ]:
        assert not (SQL_RE.search(prose) or SQL_LOWER_RE.search(prose)), prose


def test_docstrings_are_recognised() -> None:
    tree = ast.parse(
        '"""SELECT in a module docstring."""\nX = 1\n"""UPDATE x SET y."""\n'
        'def f():\n    """DELETE FROM prose."""\n    return "SELECT 1"\n'
    )
    skip = docstring_nodes(tree)
    values = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]
    assert values == ["SELECT 1"]


def test_the_layers_exist() -> None:
    for sub in ("vocabulary", "engine", "postgres"):
        assert (PACKAGE / sub / "__init__.py").is_file()
        assert sources(PACKAGE / sub)


# --- the rules ------------------------------------------------------------------------------


def test_vocabulary_imports_only_the_stdlib_and_itself() -> None:
    bad = [
        str(i)
        for i in imports_under("vocabulary")
        if not is_within(i.module, "brooq.vocabulary")
        and i.module.split(".")[0] not in sys.stdlib_module_names
    ]
    assert bad == []


def test_engine_never_imports_the_database_or_the_composition() -> None:
    found = imports_under("engine")
    assert found, "no imports found under brooq/engine"
    bad = [str(i) for i in found if any(is_within(i.module, f) for f in ENGINE_FORBIDDEN)]
    assert bad == []


# Pure libraries the engine may use: no I/O, no database driver.
ENGINE_ALLOWED_THIRD_PARTY = {"cronsim"}  # cron parsing for periodic schedules


def test_engine_imports_only_stdlib_vocabulary_and_engine() -> None:
    bad = [
        str(i)
        for i in imports_under("engine")
        if not (
            is_within(i.module, "brooq.vocabulary")
            or is_within(i.module, "brooq.engine")
            or i.module == "brooq"
            or i.module.split(".")[0] in sys.stdlib_module_names
            or i.module.split(".")[0] in ENGINE_ALLOWED_THIRD_PARTY
        )
    ]
    assert bad == []


def test_sql_lives_only_in_brooq_postgres() -> None:
    hits = []
    for path in sources():
        if is_within(module_name(path), "brooq.postgres"):
            continue
        hits.extend(sql_strings(path))
    assert hits == []


def test_postgres_really_holds_sql() -> None:
    """The detector would notice SQL: it finds the statements of the postgres layer."""
    hits = [h for p in sources(PACKAGE / "postgres") for h in sql_strings(p)]
    sql_files = list((PACKAGE / "postgres").rglob("*.sql"))
    assert hits or sql_files


def test_no_sql_files_outside_brooq_postgres() -> None:
    stray = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.sql")
        if (PACKAGE / "postgres") not in p.parents
    ]
    assert stray == []


# --- what an import really loads ------------------------------------------------------------

LOADED = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {names!r}))"


def loaded_after(statement: str) -> list[str]:
    code = f"{statement}; " + LOADED.format(names=set(THIRD_PARTY))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = ast.literal_eval(done.stdout.strip())
    return loaded


# Run the layer's own modules with a bare `brooq` package object, so that only
# what the layer itself imports is loaded (not brooq/__init__.py's re-exports).
BARE_PARENT = (
    "import sys, types; pkg = types.ModuleType('brooq'); "
    f"pkg.__path__ = [{str(PACKAGE)!r}]; sys.modules['brooq'] = pkg"
)


@pytest.mark.parametrize(
    "module",
    [
        "brooq.vocabulary",
        "brooq.engine",
        "brooq.engine.runner",
        "brooq.engine.fake",
        "brooq.engine.outcome",
        "brooq.engine.interrupts",
        "brooq.engine.kinds",
        "brooq.engine.backoff",
        "brooq.engine.store",
        "brooq.testing",
    ],
)
def test_layer_modules_load_no_third_party_package(module: str) -> None:
    assert loaded_after(f"{BARE_PARENT}; import {module}") == []


def test_every_engine_and_vocabulary_module_loads_nothing_third_party() -> None:
    modules = [module_name(p) for sub in ("vocabulary", "engine") for p in sources(PACKAGE / sub)]
    statement = BARE_PARENT + "; " + "; ".join(f"import {m}" for m in modules)
    assert loaded_after(statement) == []


@pytest.mark.parametrize("module", ["brooq.vocabulary", "brooq.engine"])
def test_importing_a_layer_as_users_do_loads_no_third_party_package(module: str) -> None:
    """``import brooq.vocabulary`` runs ``brooq/__init__.py`` first; that must stay light too."""
    assert loaded_after(f"import {module}") == []


# Without the otel extra: every module but brooq.otel imports with OpenTelemetry not
# installed (a finder refuses it), and none loads any of it when it is installed.
NO_OTEL = (
    "import sys\n"
    "class NoOtel:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'opentelemetry':\n"
    "            raise ImportError('opentelemetry is not installed (the otel extra)')\n"
    "sys.meta_path.insert(0, NoOtel())\n"
)


def test_brooq_without_the_otel_extra_imports_nothing_of_it() -> None:
    modules = sorted(
        m for p in sources() if (m := module_name(p)) != "brooq.otel" and not m.endswith("__main__")
    )
    code = NO_OTEL + "".join(f"import {m}\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == []
    assert "brooq.otel" in {module_name(p) for p in sources()}  # the one module that may


# --- every package, and the database driver at run time ---------------------------------------

DRIVER = ("psycopg", "psycopg_pool", "yoyo")
# The statements (upper case, a channel name, then the end of the statement), not prose.
LISTEN_RE = re.compile(
    r"\b(?:UN)?LISTEN\s+(?:\*|\"?[a-z_][a-z0-9_]*\"?\s*(?:;|$))"
    r"|\bNOTIFY\s+[a-z_][a-z0-9_]*\s*(?:,|;|$)|\bpg_notify\s*\("
)

# What each part of brooq may import of brooq (besides itself): the layers from the
# bottom up, then the composition. `cli` (and `__main__`) is the top: nothing imports it.
MAY_IMPORT: dict[str, set[str]] = {
    "vocabulary": set(),
    "engine": {"vocabulary"},
    "postgres": {"vocabulary", "engine"},
    "osproc": set(),
    "logs": {"vocabulary", "engine"},
    "gauges": {"engine"},
    "metrics": {"vocabulary", "engine", "osproc", "gauges"},
    "config": {"vocabulary", "engine", "postgres"},
    "testing": {"vocabulary", "engine"},
    "integrations": {"vocabulary", "postgres"},
    "pausing": {"vocabulary", "engine"},
    "queue": {"vocabulary", "engine", "postgres", "config", "pausing"},
    "async_enqueue": {"vocabulary", "postgres"},
    "app": {"vocabulary", "engine", "queue"},
    "surface": {"vocabulary", "engine", "postgres", "config", "metrics", "osproc", "logs", "queue"},
    "inprocess": {
        "vocabulary",
        "engine",
        "postgres",
        "config",
        "logs",
        "osproc",
        "queue",
        "metrics",
    },
    "supervisor": {
        "vocabulary",
        "engine",
        "postgres",
        "config",
        "logs",
        "osproc",
        "queue",
        "metrics",
        "surface",
        "app",
    },
    "demo": {"vocabulary", "engine", "postgres", "config", "queue", "testing"},
    "otel": {"vocabulary", "engine"},
}
TOP = {"cli", "__main__", "__version__"}


def part_of(module: str) -> str:
    """The part of brooq a module belongs to: ``brooq.engine.store`` → ``engine``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def test_every_part_of_brooq_has_its_import_rule() -> None:
    parts = {part_of(module_name(p)) for p in sources()} - {""}
    assert parts - set(MAY_IMPORT) - TOP == set(), "add the new part to MAY_IMPORT"


def test_each_part_imports_only_the_parts_below_it() -> None:
    bad = []
    for path in sources():
        part = part_of(module_name(path))
        if part in TOP or part == "":
            continue
        for imp in collect_imports(parse(path), path, module_name(path)):
            if imp.module.split(".")[0] != "brooq" or imp.module == "brooq":
                continue
            target = part_of(imp.module)
            if target != part and target not in MAY_IMPORT[part] and target not in TOP - {"cli"}:
                bad.append(f"{imp} ({part} may import {sorted(MAY_IMPORT[part])})")
    assert bad == []


def test_nothing_imports_the_cli() -> None:
    bad = [
        str(imp)
        for path in sources()
        if part_of(module_name(path)) not in {"cli", "__main__"}
        for imp in collect_imports(parse(path), path, module_name(path))
        if is_within(imp.module, "brooq.cli")
    ]
    assert bad == []


def test_the_database_driver_is_loaded_only_by_brooq_postgres() -> None:
    """psycopg, psycopg_pool and yoyo are imported at run time only under brooq/postgres/
    (elsewhere at most under TYPE_CHECKING, for the annotations of the public API)."""
    bad = []
    for path in sources():
        if is_within(module_name(path), "brooq.postgres"):
            continue
        tree = parse(path)
        typing_only = type_checking_lines(tree)
        bad += [
            str(imp)
            for imp in collect_imports(tree, path, module_name(path))
            if imp.module.split(".")[0] in DRIVER and imp.line not in typing_only
        ]
    assert bad == []


def test_listen_and_notify_live_only_in_brooq_postgres() -> None:
    hits = []
    for path in sources():
        if is_within(module_name(path), "brooq.postgres"):
            continue
        tree = parse(path)
        skip = docstring_nodes(tree)
        hits += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and LISTEN_RE.search(node.value)
        ]
    assert hits == []


def test_the_listen_detector_sees_listen() -> None:
    for statement in [
        "LISTEN brooq_job",
        'LISTEN "brooq_cancel";',
        "UNLISTEN *",
        "NOTIFY brooq_job, 'noop'",
        "SELECT pg_notify('brooq_job', topic)",
    ]:
        assert LISTEN_RE.search(statement), statement
    for prose in ["listen to the workers", "when no NOTIFY wakes them", "the LISTEN thread reads"]:
        assert not LISTEN_RE.search(prose), prose


# --- the supervisor's parts take what they use ---------------------------------------------------

ARBITER = "brooq.supervisor.arbiter"
ARBITER_CALLERS = {"brooq.supervisor.arbiter", "brooq.cli.run"}
"""The arbiter itself and its entry point (``brooq supervise``)."""


def test_no_part_of_the_supervisor_reaches_back_into_the_arbiter() -> None:
    """Each part is built from what it uses: only the arbiter and its entry point import it,
    not even under TYPE_CHECKING (a part that needs the whole Supervisor reaches into it)."""
    bad = [
        str(imp)
        for path in sources()
        if module_name(path) not in ARBITER_CALLERS
        for imp in collect_imports(parse(path), path, module_name(path))
        if is_within(imp.module, ARBITER)
    ]
    assert bad == []


def test_the_arbiter_rule_would_catch_a_type_checking_import() -> None:
    code = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .arbiter import Supervisor\n"
    )
    path = PACKAGE / "supervisor" / "exits.py"
    found = collect_imports(ast.parse(code), path, "brooq.supervisor.exits")
    assert any(is_within(i.module, ARBITER) for i in found)


MAX_MODULE_LINES = 400


def test_no_module_of_brooq_is_over_400_lines() -> None:
    """Small modules named for what they hold: a longer one is split where its concepts split."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
