"""Every command README.md and docs/*.md show is checked, so none goes stale.

Pages are discovered (README.md and every docs/*.md), and every ```bash block in them is read as commands
(`\\` continuations joined, `&&` chains split, comments dropped; synopses with placeholders belong in ```text
blocks). Each command is then:
- a raylm command (`raylm ...`, `python -m raylm ...`, or the raylm part of `ray job submit ... -- raylm ...`):
  parsed by raylm's real parser into its settings (an eval's EvalConfig built and validated, a sweep file loaded, a
  probe file read), and, where it would run offline here (a local model or --demo), every path it names must
  exist. It is not run: what each such command does is proven by the tests of that command (tests/test_cli.py
  runs the demo and --log-samples, tests/test_resume.py a killed and resumed run, tests/test_contamination.py
  the scan and --decontaminate, tests/test_corpus.py ppl, tests/test_lowp_lmeval.py bfloat16, tests/
  test_chat_template.py a system instruction), and running the page's copy proved nothing those do not;
- `python - <<'EOF' ...`: run (a page's own script, which nothing else runs); `python -c ...`: compiled;
- else one of the commands exercised elsewhere (EXERCISED_ELSEWHERE: installs and the suite by .ci/run, the
  benchmarks by their own runs, cluster launchers needing a cluster), whose files must exist. Anything else fails.
```python blocks must compile and import only names that exist.

docs/cli.md's flag reference is the parser's own --help text (`python tests/test_docs.py --write` rewrites it),
and docs/switching-from-lm-eval.md's flag table names every lm-eval flag raylm renames or refuses.
"""

from __future__ import annotations

import ast
import glob
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI_PAGE = REPO / "docs" / "cli.md"
GENERATED = "<!-- generated from the parser: python tests/test_docs.py --write -->"
COMMANDS = ("eval", "sweep", "ppl", "kl", "probe", "contamination", "membership", "compare", "report")
HELP_COLUMNS = "100"
# Commands whose first words are these are exercised elsewhere; the reason says where.
EXERCISED_ELSEWHERE = {
    ("python3", "-m", "venv"): ".ci/run makes a fresh virtual environment exactly so",
    (".",): ".ci/run activates its virtual environment exactly so",
    ("pip", "install"): ".ci/run installs as the README says",
    ("python", "-m", "pytest"): ".ci/run runs the suite",
    ("python", "../shared/golden/make/mk_local_tasks.py"): "tests/conftest.py's local_tasks fixture runs it",
    ("python", "bench/"): "a benchmark, run on a quiet machine (tests/test_bench_gpu_driver.py runs the GPU one)",
    ("bash", "bench/"): "the GPU benchmark, run on a lent accelerator",
    ("ray", "up"): "needs a cloud account (cluster.yaml validates in tests/test_cluster_config.py)",
    ("ray", "down"): "needs a cloud account",
    ("ray", "dashboard"): "needs a launched cluster",
    ("ray", "rsync-down"): "needs a launched cluster",
    ("docker", "build"): "needs Docker (tests/test_rayjob.py checks the Dockerfile's FROM and install lines)",
    ("sbatch",): "needs a Slurm cluster; docs/cluster.md says the recipe is untested",
    ("ray", "start"): "starts a cluster (tests/test_job_submit.py does, against a real head)",
    ("ray", "stop"): "stops the user's own cluster (never in tests: it stops every Ray on the machine)",
    ("kubectl",): "needs a Kubernetes cluster",
    ("helm",): "needs a Kubernetes cluster",
}


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # docs/*/ hold generated files


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[tuple[list[str], str, bool]]:
    """The block's commands as (argv, heredoc, refused): heredoc is what a `<<'EOF'` line feeds the command."""
    out = []
    lines = iter(block.replace("\\\n", " ").splitlines())
    for line in lines:
        heredoc = ""
        if (here := re.search(r"<<'?(\w+)'?", line)) is not None:
            body = []
            for following in lines:
                if following == here.group(1):
                    break
                body.append(following)
            heredoc = "\n".join(body) + "\n"
            line = line[:here.start()]
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append((words[:cut], heredoc, _refused(line)))
            words = words[cut + 1:]
    return [(argv, heredoc, refused) for argv, heredoc, refused in out if argv]


def _refused(line: str) -> bool:
    """A command the page shows being refused says so in its comment (`# ...: refused, naming why`)."""
    return "#" in line and re.search(r"\brefused\b", line.split("#", 1)[1]) is not None


def every_command() -> list[tuple[str, list[str], str, bool]]:
    return [(str(page.relative_to(REPO)), argv, heredoc, refused) for page in pages()
            for block in blocks(page, "bash") for argv, heredoc, refused in commands(block)]


def without_timeout(argv: list[str]) -> list[str]:
    """`timeout [-s SIGNAL] SECONDS command...` -> command: the page kills it to show a resume; run here whole."""
    if argv[:1] != ["timeout"]:
        return argv
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("-s", "--signal", "-k", "--kill-after") else rest[1:]
    return rest[1:]


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        key, _, value = argv[0].partition("=")
        env[key] = value.replace("$PWD", str(REPO))
        argv = argv[1:]
    return env, argv


def raylm_part(argv: list[str]) -> list[str] | None:
    if argv[:1] == ["raylm"]:
        return argv[1:]
    if argv[:3] == ["python", "-m", "raylm"]:
        return argv[3:]
    if argv[:3] == ["ray", "job", "submit"] and "--" in argv:
        return raylm_part(argv[argv.index("--") + 1:])
    return None


def _option(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def parsed(argv: list[str]):
    """raylm's own reading of the command: its settings, or a failure naming why."""
    from raylm.cli import config_from_args, parse_args

    if "--help" in argv or "-h" in argv:
        with pytest.raises(SystemExit) as exited, redirect_stdout(io.StringIO()):
            parse_args(argv)
        assert exited.value.code == 0, argv
        return None, None
    args = parse_args(argv)
    if args.command == "eval":
        return args, config_from_args(args)
    if args.command == "sweep":
        from raylm.sweep.config import load_sweep

        return args, load_sweep(REPO / args.file)
    if args.command == "probe" and args.probes is not None:
        from raylm.probe.file import load_probes

        return args, load_probes(REPO / args.probes)
    return args, None


def runs_offline(args) -> bool:
    """A command whose model is here (a local model, or the demo): an eval, ppl or scan a reader can run offline
    from a checkout; sweeps and probes only parse."""
    from raylm.models.spec import looks_local

    if args is None or args.command not in ("eval", "ppl", "contamination"):
        return False
    if args.command == "contamination":
        return True
    model = args.model or ("demo" if getattr(args, "demo", False) else None)
    return model == "demo" or (model is not None and looks_local(model) and (REPO / model).exists())


def named_paths(args, argv: list[str]) -> list[str]:
    """The inputs a command that runs offline reads, relative to the checkout: they must exist there. A page's
    earlier command can write one (a scan that --decontaminate then reads), so outputs written before count."""
    if args.command == "contamination":
        return [p for p in (args.corpus or []) if "*" not in p] + ([str(args.data_dir)] if args.data_dir else [])
    if args.command == "ppl":
        return [args.data]
    return [p for p in (_option(argv, flag) for flag in ("--data-dir", "--include-path", "--include_path",
                                                          "--decontaminate")) if p is not None and
            not os.path.isabs(p)]


@pytest.fixture(scope="module")
def ran():
    """Every command of every page, classified and parsed, in page order. A page's `python -` script runs (what it
    writes in the checkout is removed afterwards); the paths an offline raylm command reads must exist, or be
    the output of one of the page's earlier commands."""
    done = []
    written: set[str] = set()
    cwd = os.getcwd()
    before = set(REPO.iterdir())
    os.chdir(REPO)
    try:
        for page, argv, heredoc, refused in every_command():
            env, words = split_env(argv)
            words = without_timeout(words)
            raylm_argv = raylm_part(words)
            if raylm_argv is not None:
                args, _ = parsed(raylm_argv)
                if args is not None and getattr(args, "output", None) is not None:
                    written.add(str(args.output))
                if runs_offline(args) and words[:3] != ["ray", "job", "submit"]:
                    missing = [p for p in named_paths(args, raylm_argv)
                               if p not in written and not glob.glob(str(REPO / p))]
                    done.append((page, argv, "parsed", f"reads {missing}, which do not exist" if missing else 0))
                else:
                    done.append((page, argv, "parsed", 0))
            elif words == ["python", "-"] and heredoc:
                proc = subprocess.run([sys.executable, "-"], input=heredoc, capture_output=True, text=True,
                                      timeout=120, env={**os.environ, **env})
                done.append((page, argv, "ran", 0 if proc.returncode == 0 else proc.stderr[-2000:]))
            elif words[:2] == ["python", "-c"]:
                compile(words[2], f"{page}: python -c", "exec")
                done.append((page, argv, "parsed", 0))
            else:
                reason = next((why for prefix, why in EXERCISED_ELSEWHERE.items()
                               if tuple(words[:len(prefix) - 1]) == prefix[:-1] and
                               words[len(prefix) - 1:len(prefix)] and
                               words[len(prefix) - 1].startswith(prefix[-1])), None)
                done.append((page, argv, "elsewhere" if reason else "unknown", reason))
    finally:
        os.chdir(cwd)
        for path in set(REPO.iterdir()) - before:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return done


def test_every_shown_command_is_parsed_run_or_exercised_elsewhere(ran):
    unknown = [(page, " ".join(argv)) for page, argv, kind, _ in ran if kind == "unknown"]
    assert not unknown, f"commands no test exercises: {unknown}"
    failed = [(page, " ".join(argv), result) for page, argv, kind, result in ran if result != 0 and
              kind in ("ran", "parsed")]
    assert not failed, failed
    assert any(kind == "parsed" for _, _, kind, _ in ran)


def test_files_named_by_commands_run_elsewhere_exist(ran):
    for page, argv, kind, _ in ran:
        if kind == "elsewhere":
            for word in argv:
                if word.endswith((".py", ".sh", ".yaml")) and not word.startswith(("/", "-")):
                    assert (REPO / word).exists(), (page, word)


@pytest.mark.parametrize("page", [str(p.relative_to(REPO)) for p in pages()])
def test_python_examples_compile_and_import_what_exists(page):
    for block in blocks(REPO / page, "python"):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raylm"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (page, node.module, alias.name)


def test_every_page_starts_with_an_example():
    """A page opens with a command or code block: before its first section, after at most a short lead-in."""
    for page in pages()[1:]:
        text = page.read_text()
        first = re.search(r"^```", text, re.MULTILINE)
        section = re.search(r"^## ", text, re.MULTILINE)
        lead = [line for line in text[:first.start()].splitlines() if line.strip()] if first else []
        assert first and (section is None or first.start() < section.start()) and len(lead) <= 6, \
            f"{page.relative_to(REPO)} does not open with an example"


def test_links_between_pages_resolve():
    for page in pages():
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)


def test_the_data_path_page_names_every_module():
    text = (REPO / "docs" / "how-it-works.md").read_text()
    missing = [str(p.relative_to(REPO)) for p in sorted((REPO / "raylm").rglob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in text]
    assert not missing, f"docs/how-it-works.md does not place {missing}"


def cli_reference() -> str:
    """docs/cli.md's generated part: each subcommand's --help at a fixed width."""
    from raylm.cli import build_parser

    os.environ["COLUMNS"] = HELP_COLUMNS
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    parts = [GENERATED]
    for name in COMMANDS:
        text = sub.choices[name].format_help().rstrip()
        parts.append(f"## raylm {name}\n\n```text\n{text}\n```")
    return "\n\n".join(parts) + "\n"


def test_the_flag_reference_is_the_parsers_own():
    text = CLI_PAGE.read_text()
    assert GENERATED in text
    assert text[text.index(GENERATED):] == cli_reference(), "docs/cli.md is stale: python tests/test_docs.py --write"


def test_the_lm_eval_flag_table_names_every_flag_raylm_renames_or_refuses():
    from raylm.cli import build_parser, eval_options
    from raylm.cli.lmeval import REFUSED, RENAMED, translate

    page = (REPO / "docs" / "switching-from-lm-eval.md").read_text()
    section = page.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    lm_eval_column = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `-")]
    named = {flag for cell in lm_eval_column for flag in re.findall(r"(?<![\w-])(-{1,2}[A-Za-z_]+)", cell)}
    long_refused = {flag for flag in REFUSED if flag.startswith("--")}
    assert long_refused <= named, long_refused - named
    assert {flag for flag in RENAMED if flag.startswith("--")} <= named
    known = eval_options(build_parser())
    for flag in sorted(named - set(REFUSED)):
        assert translate(["eval", flag], known)[1] in known, flag


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    text = CLI_PAGE.read_text()
    head = text[:text.index(GENERATED)] if GENERATED in text else text.rstrip() + "\n\n"
    CLI_PAGE.write_text(head + cli_reference())
    print(f"wrote {CLI_PAGE}")
