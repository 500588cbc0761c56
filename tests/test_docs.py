"""The documentation names only things that exist: README.md and docs/*.md are read as text and
every link, image, anchor, ``make`` target, script and its ``--flags``, module, function, file
path, ``WAGMA_*`` variable and config key they name is checked against the repository at test time
(nothing is run, no MPI; the config schemas are read, so renamed keys are followed)."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


from wagma_rl.rl.config import DDPPOConfig as RLConfig  # noqa: E402
from wagma_rl.supervised.config import SupervisedConfig  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCHEMAS = (RLConfig, SupervisedConfig)

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")  # an inline span may wrap onto the next line
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HTML_SRC = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""")
MAKE = re.compile(r"\bmake\s+((?:[a-z][\w-]*\s*)+)")
PYTHON = re.compile(r"(?:^|[\s/;(])python3?\s+(?:-u\s+)?(?:-m\s+([\w.]+)|([\w./-]+\.py)\b)")
# A config key as an override (run.name=x) or named alone (distrib.global_mode); file names such
# as train.sbatch are told apart by their extension.
KEY = re.compile(r"(?<![\w./$-])([a-z_]+(?:\.[a-z_][a-z0-9_]*)+)(?==|\b(?![./(-]))")
# A repository path in the text (docs/x.md, configs/y.yaml, native_coll/src/...), and a dotted name
# of one of the project's modules (wagma_rl.bounded_comm.DEFAULT_TIMEOUT, native_coll.group_of).
REPO_PATH = re.compile(r"(?<![\w./:-])((?:configs|benchmarks|docs|envs|wagma_rl|native_coll|tests|"
                       r"scripts|cluster|\.ci)/[\w./-]*[\w/])")
DOTTED = re.compile(r"(?<![\w./-])((?:wagma_rl|native_coll|envs|cluster|benchmarks)(?:\.[A-Za-z_]\w*)+)")
FILE_EXT = {"py", "md", "sh", "sbatch", "yaml", "yml", "csv", "json", "gz", "png", "c", "h", "txt",
            "pt", "so", "toml", "cfg", "glb", "npz", "log", "tfevents",
            "src", "tgt"}  # the supervised parallel text files: train.src, valid.tgt


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _code(text: str) -> tuple[list[str], list[str]]:
    """The fenced blocks and the inline code spans (outside the fenced blocks) of a page; a span
    that wraps is one line, as are a block's lines continued with a backslash."""
    blocks = [b.replace("\\\n", " ") for b in FENCE.findall(text)]
    rest = FENCE.sub("", text)
    return blocks, [span.replace("\n", " ") for span in INLINE.findall(rest)]


def _commands(snippet: str) -> list[tuple[list[Path], list[str]]]:
    """``(source, flags)`` for every ``python script.py ...`` / ``python -m module ...`` of the
    repository in ``snippet``: the file(s) that define the command line and the ``--flags`` given
    to it (``-- other.py`` hands the rest to that script, as ``cluster.netns run`` does; ``--``
    before anything else starts another command, found on its own)."""
    out = []
    for line in snippet.splitlines():
        line = re.split(r"\s#\s|&&|\|\||;|\|", line)[0]
        for m in PYTHON.finditer(line):
            module, script = m.groups()
            target = _module_sources(module) if module else [ROOT / script]
            flags: list[str] = []
            tokens = line[m.end():].split()
            for i, tok in enumerate(tokens):
                if tok == "--" and i + 1 < len(tokens) and tokens[i + 1].endswith(".py"):
                    out.append((target, flags))
                    target, flags = [ROOT / tokens[i + 1]], []
                elif tok == "--":  # the rest is another command (python -m wagma_rl.elastic -- ...)
                    break
                elif re.fullmatch(r"--[a-z][\w-]*(=.*)?", tok):
                    flags.append(tok.split("=")[0])
            out.append((target, flags))
    return [(t, f) for t, f in out if t and all(p.is_file() for p in t)]


def _module_sources(name: str) -> list[Path]:
    """The repository files of ``python -m name``: its module file, or its package's files."""
    rel = Path(*name.split("."))
    if (ROOT / rel.with_suffix(".py")).is_file():
        return [ROOT / rel.with_suffix(".py")]
    if (ROOT / rel).is_dir():
        return sorted((ROOT / rel).glob("*.py"))
    return []


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``_`` and ``-`` dropped, spaces to
    hyphens."""
    text = FENCE.sub("", _text(page))
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        heading = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


def _schema_key(schema: type, parts: list[str]) -> bool:
    """Whether ``parts`` is a path of fields in dataclass ``schema`` (a free-form dict field takes
    any further keys)."""
    node: typing.Any = schema
    for part in parts:
        if not dataclasses.is_dataclass(node):
            return typing.get_origin(node) is dict or node is dict
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        node = hints[part]
    return True


def _sections() -> set[str]:
    return {f.name for schema in SCHEMAS for f in dataclasses.fields(schema)}


def _is_key(dotted: str) -> bool:
    return any(_schema_key(schema, dotted.split(".")) for schema in SCHEMAS)


def _key_candidates(snippet: str) -> list[str]:
    sections = _sections()
    out = []
    for key in KEY.findall(snippet):
        parts = key.split(".")
        if parts[0] in sections and parts[-1] not in FILE_EXT:
            out.append(key)
    return out


def _yaml_keys(block: str) -> list[str]:
    """The dotted keys of a YAML block that is a config (its top level names schema sections)."""
    import yaml

    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict) or not data or not set(data) <= _sections():
        return []
    out = []

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            out.append(key)
            if isinstance(v, dict) and _is_key(key) and not _schema_key_is_dict(key):
                walk(v, key + ".")

    walk(data, "")
    return out


def _schema_key_is_dict(dotted: str) -> bool:
    for schema in SCHEMAS:
        node: typing.Any = schema
        try:
            for part in dotted.split("."):
                node = typing.get_type_hints(node)[part]
        except (KeyError, TypeError):
            continue
        if typing.get_origin(node) is dict or node is dict:
            return True
    return False


def _module_exists(name: str) -> bool:
    """A module path exists as a file or package in the repository, or as an installed top-level
    module (found without importing it)."""
    rel = Path(*name.split("."))
    if (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file() \
            or (ROOT / rel / "__main__.py").is_file():
        return True
    if (ROOT / name.split(".")[0]).exists():
        return False
    return "." not in name and importlib.util.find_spec(name) is not None


def _path_exists(rel: str) -> bool:
    """``rel`` exists, or names files by their common start: an ``--out`` prefix without its
    extension, or a template cut at ``{`` / ``*`` / ``<`` (``collective_{4,8}.md``)."""
    path = ROOT / rel
    if path.exists():
        return True
    return path.parent.is_dir() and any(p.name.startswith(path.name) for p in path.parent.iterdir())


def _name_exists(dotted: str) -> bool:
    """The longest module prefix of ``dotted`` is a repository file and the next name is defined
    or imported there (read as text, not imported)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        rel = Path(*parts[:i])
        for file in (ROOT / rel.with_suffix(".py"), ROOT / rel / "__init__.py"):
            if file.is_file():
                rest = parts[i:]
                return not rest or re.search(rf"\b{re.escape(rest[0])}\b",
                                             file.read_text(encoding="utf-8")) is not None
    return False


def _ids(pages):
    return [p.relative_to(ROOT).as_posix() for p in pages]


def test_the_pages_exist():
    assert (ROOT / "README.md").is_file() and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_relative_link_and_image_resolves(page):
    text = FENCE.sub("", _text(page))
    bad = []
    for target in LINK.findall(text) + HTML_SRC.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_repository_path_named_exists(page):
    assert sorted({p for p in REPO_PATH.findall(_text(page)) if not _path_exists(p)}) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_module_function_and_class_named_exists(page):
    blocks, spans = _code(_text(page))
    names = {n for snippet in blocks + spans for n in DOTTED.findall(snippet)}
    assert sorted(n for n in names if not _name_exists(n)) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_project_environment_variable_named_is_read_somewhere(page):
    named = set(re.findall(r"\bWAGMA_[A-Z0-9_]+", _text(page)))
    sources = [p for d in ("wagma_rl", "native_coll", "envs", "cluster", "scripts", "benchmarks")
               for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".sh", ".c", ".h", ".sbatch")]
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sources)
    assert sorted(v for v in named if v not in text) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_make_target_named_exists(page):
    makefile = _text(ROOT / "Makefile")
    targets = set(re.findall(r"^([\w-]+)\s*:", makefile, re.M))
    blocks, spans = _code(_text(page))
    named = set()
    for snippet in blocks + spans:
        for line in snippet.splitlines():
            line = line.split("#")[0]
            for m in MAKE.finditer(line):
                named.update(w for w in m.group(1).split() if not w.startswith("-"))
    assert sorted(named - targets) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_script_and_module_named_exists(page):
    blocks, spans = _code(_text(page))
    bad = []
    for snippet in blocks + spans:
        for module, script in PYTHON.findall(snippet):
            if script and not (ROOT / script).is_file():
                bad.append(script)
            if module and not _module_exists(module):
                bad.append(f"-m {module}")
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_flag_given_to_a_script_is_one_it_defines(page):
    """A ``--flag`` of a repository script or module named in the docs is a string in its source
    (argparse's ``add_argument("--flag"``); nothing is run."""
    blocks, spans = _code(_text(page))
    bad = []
    for snippet in blocks + spans:
        for sources, flags in _commands(snippet):
            text = "".join(p.read_text(encoding="utf-8") for p in sources)
            bad += [f"{sources[0].relative_to(ROOT)} {flag}" for flag in flags
                    if flag != "--help" and f'"{flag}"' not in text]
    assert sorted(set(bad)) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_config_key_named_is_in_a_schema(page):
    blocks, spans = _code(_text(page))
    # A block that shows the error for a mistyped key names that key on purpose.
    blocks = [b for b in blocks if "unknown config key" not in b]
    keys = [k for snippet in blocks + spans for k in _key_candidates(snippet)]
    keys += [k for block in blocks for k in _yaml_keys(block)]
    assert sorted({k for k in keys if not _is_key(k)}) == []


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
BENCH = re.compile(r"python3?\s+(benchmarks/[\w/]+\.py)((?:\s+[^\s;&|#]+)*)")


def _figure_commands(page: Path) -> list[tuple[Path, list[str]]]:
    """``(script, arguments)`` of every ``python benchmarks/<script>.py ...`` on the page."""
    blocks, spans = _code(_text(page))
    return [(ROOT / m[1], [t.strip("'\"") for t in m[2].split()])
            for snippet in blocks + spans for line in snippet.splitlines()
            for m in BENCH.finditer(line)]


def _draws(figure: str, script: Path, args: list[str]) -> bool:
    """Whether ``python script args`` writes ``figure`` (a repository path): an argument names
    it, or names its prefix (``--plots docs/modes_{ranks}r`` draws ``docs/modes_4r_*.png``), or
    the script itself names the file (a fixed name in its default folder)."""
    for arg in args:
        pattern = re.escape(arg).replace(re.escape("{ranks}"), r"\d+")
        if re.fullmatch(pattern if arg.endswith(".png") else pattern + r"_\w+\.png", figure):
            return True
    return script.is_file() and Path(figure).name in script.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_figure_shown_names_the_command_that_draws_it(page):
    commands = _figure_commands(page)
    figures = [(page.parent / f).resolve().relative_to(ROOT).as_posix()
               for f in IMAGE.findall(FENCE.sub("", _text(page)))]
    assert [f for f in figures if not any(_draws(f, *c) for c in commands)] == []


def test_the_checks_catch_what_they_look_for():
    """The checks above fail on a wrong name (a test of the test)."""
    assert not _is_key("averaging.no_such_key") and _is_key("averaging.group_size")
    assert _is_key("env.options.anything")  # a free-form mapping
    plot = ROOT / "benchmarks/modes_plot.py"
    assert _draws("docs/modes_4r_x_wall.png", plot, ["--plots", "docs/modes_{ranks}r_x"])
    assert not _draws("docs/modes_4r_wall.png", plot, ["--plots", "docs"])
    assert _draws("docs/c.png", plot, ["--out", "docs/c.png"]) and not _draws("docs/c.png", plot, [])
    assert _key_candidates("run_ddppo.py averaging.name=wagma scripts/slurm/train.sbatch") == \
        ["averaging.name"]
    assert _yaml_keys("averaging:\n  name: wagma\n  nope: 1\n") == ["averaging", "averaging.name",
                                                                   "averaging.nope"]
    assert not _module_exists("wagma_rl.no_such_module") and _module_exists("wagma_rl.scale")
    assert _name_exists("wagma_rl.bounded_comm.DEFAULT_TIMEOUT") and _name_exists("native_coll.group_of")
    assert not _name_exists("wagma_rl.bounded_comm.NO_SUCH_NAME") and not _name_exists("wagma_rl.nope")
    assert _path_exists("benchmarks/results/collective_") and not _path_exists("configs/nope.yaml")
    assert REPO_PATH.findall("see docs/faults.md, https://x.org/docs/a.md") == ["docs/faults.md"]
    assert {"distributed-optimizers-wagma_rloptim", "supervised-jobs"} <= _anchors(ROOT / "docs/optimizers.md")
    assert PYTHON.findall("mpiexec -n 2 .venv/bin/python benchmarks/x.py --a") == \
        [("", "benchmarks/x.py")]
    netns = _commands("python -m cluster.netns run --nodes 2 -- benchmarks/collective.py --no-gloo")
    assert [(sorted(p.name for p in t), f) for t, f in netns] == \
        [(["netns.py"], ["--nodes"]), (["collective.py"], ["--no-gloo"])]
    assert [f for _, f in _commands("python -m wagma_rl.scale --workers 8 --no-such-flag")] == \
        [["--workers", "--no-such-flag"]]


# A page named in the code or the docs' plain text: docs/x.md, docs/x.md#anchor, or
# "docs/x.md, Section title" (a docstring that names the section in words).
DOC_REF = re.compile(r"(?<![\w./-])(docs/[\w/-]+\.md)(?:#([\w-]+)|, ([A-Z][\w ()`.,'-]*?)\))?")
CODE_DIRS = ("wagma_rl", "envs", "native_coll", "benchmarks", "scripts", "tests", "configs", "cluster",
             ".ci")
CODE_FILES = sorted(({p for d in CODE_DIRS for p in (ROOT / d).rglob("*")
                     if p.is_file() and p.suffix in (".py", ".sh", ".sbatch", ".yaml", ".yml", ".c",
                                                     ".h", ".in", "")
                     and "results" not in p.relative_to(ROOT).parts}
                     | {ROOT / "Makefile", ROOT / "run_ddppo.py", ROOT / "CMakeLists.txt"})
                    - {Path(__file__).resolve()})  # this file names broken ones on purpose


def _broken_doc_refs(text: str) -> list[str]:
    """The ``docs/...md`` references in ``text`` whose page, ``#anchor`` or named section does not
    exist."""
    bad = []
    for path, anchor, section in DOC_REF.findall(text):
        page = ROOT / path
        if not page.is_file():
            bad.append(path)
        elif anchor and anchor not in _anchors(page):
            bad.append(f"{path}#{anchor}")
        elif section and re.sub(r"[^\w\- ]", "", section.lower()).replace(" ", "-") not in _anchors(page):
            bad.append(f"{path}, {section}")
    return bad


@pytest.mark.parametrize("source", CODE_FILES, ids=_ids(CODE_FILES))
def test_every_docs_page_and_anchor_named_in_the_code_exists(source):
    assert _broken_doc_refs(source.read_text(encoding="utf-8", errors="replace")) == []


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_docs_page_and_anchor_named_in_the_text_exists(page):
    assert _broken_doc_refs(_text(page)) == []


def test_the_docs_reference_check_catches_a_broken_one():
    assert _broken_doc_refs("see docs/faults.md#elastic and docs/nope.md") == \
        ["docs/faults.md#elastic", "docs/nope.md"]
    assert _broken_doc_refs("(docs/results/training.md, Mode comparison)") == []
    assert _broken_doc_refs("(docs/training.md, No such section)") == ["docs/training.md, No such section"]
    assert _broken_doc_refs("docs/faults.md#going-on-without-lost-ranks-python--m-wagma_rlelastic") == []
