"""`raylm report`: the page built from runs written by raylm's writers from random scores (tests/test_compare.py's
runs, no model) and from two `raylm ppl` outputs (its corpus_runs), read back as HTML: its tables hold the numbers
results.json and raylm compare hold, its score distributions the samples' scores, it loads nothing, it escapes
what the results say; and opened in a real headless Chromium, which renders it."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_compare import CORPUS_FILES, _write_run, built, compared, corpus_runs, runs  # noqa: F401  (fixtures)

from raylm.cli import main
from raylm.compare.find import find_runs
from raylm.compare.page import report_page
from raylm.compare.run import Run
from raylm.results.distributions import PER_CHARACTER, SUMMED, choice_scores

CHROMIUM = "/usr/bin/chromium"
MULTIPLE_CHOICE = 10  # per run: arc_easy_local, boolq_local, piqa_local, hellaswag and mmlu_local's six subjects
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


class Page(HTMLParser):
    """The page's tables (id -> rows of cell texts), its <svg> count, title, every tag and attribute seen, and
each run's score distribution charts (run index -> each chart's texts)."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.title, self.svgs = "", 0
        self.svg_text: list[str] = []  # the charts' text, kept as text
        self.distributions: dict[int, list[list[str]]] = {}
        self._charts: list[list[str]] | None = None
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._in_title = self._in_text = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "svg":
            self.svgs += 1
            if self._charts is not None:
                self._charts.append([])
        elif tag == "div" and (attrs.get("id") or "").startswith("distributions-"):
            self._charts = self.distributions.setdefault(int(attrs["id"].split("-")[1]), [])
        self._in_title = tag == "title"
        self._in_text = tag == "text"

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "div":
            self._charts = None
        self._in_title = self._in_text = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_title:
            self.title += data
        if self._in_text:
            self.svg_text.append(data)
            if self._charts:
                self._charts[-1].append(data)


def _number(cell: str) -> float | None:
    return None if cell in ("", "N/A", "n/a") else float(cell)


def _results_rows(page: Page, table_id: str) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    """(task, metric, filter) -> (value, stderr) as the page's results table shows them."""
    header, *rows = page.tables[table_id]
    assert header == ["Tasks" if table_id.startswith("results") else "Groups", "Version", "Filter", "n-shot",
                      "Metric", "", "Value", "", "Stderr"]
    return {(r[0], r[4], r[2]): (_number(r[6]), _number(r[8])) for r in rows}


def _expected(results: dict, column: str) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    out = {}
    for task, values in results.get(column, {}).items():
        for key, value in values.items():
            metric, _, filter_key = key.partition(",")
            if filter_key and not metric.endswith("_stderr"):
                stderr = values.get(f"{metric}_stderr,{filter_key}")
                out[(task, metric, filter_key)] = (value, None if stderr in (None, "N/A") else stderr)
    return out


@pytest.fixture(scope="module")
def page(runs):
    a, b, _, _ = runs
    text, refused = report_page(find_runs(a) + find_runs(b))
    assert refused is None
    return text


def test_the_results_tables_hold_every_number_results_json_holds(runs, page):
    a, b, _, _ = runs
    parsed = Page(page)
    for i, run in enumerate((a, b)):
        results = json.loads((run / "results.json").read_text())
        for column in ("results", "groups"):
            shown = _results_rows(parsed, f"{column}-{i}")
            expected = _expected(results, column)
            assert set(shown) == set(expected) and expected
            for key, (value, stderr) in expected.items():
                assert shown[key][0] == pytest.approx(value, abs=5e-5), key  # shown to 4 places, as lm-eval
                assert shown[key][1] == (None if stderr is None else pytest.approx(stderr, abs=5e-5)), key
        config = dict(parsed.tables[f"config-{i}"])
        assert config["model"] == results["config"]["model"]
        assert json.loads(config["tasks"]) == results["config"]["tasks"]
        assert float(config["wall_time_s"]) == results["config"]["wall_time_s"]
        assert json.loads(config["versions"]) == results["config"]["versions"]
        assert json.loads(config["n-shot"]) == results["n-shot"]


def test_the_comparison_table_is_raylm_compares_and_is_charted(runs, page):
    a, b, _, _ = runs
    parsed = Page(page)
    header, *rows = parsed.tables["comparison-0"]
    assert header[:6] == ["task", "metric", "n", "a", "b", "b − a"]
    pair = compared(a, b)["comparisons"][0]
    expected = {(task, metric): d for task, entry in pair["tasks"].items() for metric, d in entry["metrics"].items()}
    shown = {(r[0], r[1]): r[2:] for r in rows}
    assert set(shown) == set(expected) and {"mmlu_local", "hellaswag", "wikitext"} <= {t for t, _ in shown}
    for key, d in expected.items():
        se = d.get("diff_stderr_clustered") or d["diff_stderr"]
        numbers = [d["n"], d["a"], d["b"], d["diff"], se, d["unpaired_stderr"], d["ci95_low"], d["ci95_high"],
                   d["p_value"]]
        assert len(shown[key]) == len(numbers)
        for cell, number in zip(shown[key][:-1], numbers[:-1]):  # to 4 places
            assert _number(cell) == (None if number is None else pytest.approx(number, abs=5e-5)), (key, cell)
        assert _number(shown[key][-1]) == pytest.approx(d["p_value"], rel=5e-3), key  # 3 significant digits
    assert parsed.svgs == 2 + 2 * MULTIPLE_CHOICE  # the comparison's, the runs' metrics and the distributions
    assert set(pair["tasks"]) <= set(parsed.svg_text)  # every compared task and group charted
    assert "b − a in acc, with its 95% interval" in parsed.svg_text


def test_corpus_runs_show_their_figures_per_domain_and_their_paired_bits_per_byte(corpus_runs):
    """A corpus run's results table holds its figures for the corpus, each domain and the macro average, as
    results.json holds them; the comparison table and chart hold raylm compare's bits per byte rows."""
    ca, cb = corpus_runs
    text, refused = report_page(find_runs(ca) + find_runs(cb))
    parsed = Page(text)
    assert refused is None
    for i, run in enumerate((ca, cb)):
        data = json.loads((run / "results.json").read_text())
        ppl = data["results"]["ppl"]
        expected = {"ppl": ppl, **{f"ppl/{d}": figures for d, figures in ppl["domains"].items()}, "ppl macro": ppl["macro"]}
        shown = _results_rows(parsed, f"results-{i}")
        assert {task for task, _, _ in shown} == set(expected)
        for task, figures in expected.items():
            for figure in ("bits_per_byte", "bits_per_char", "byte_perplexity"):
                assert shown[(task, figure, "none")] == (pytest.approx(figures[figure], abs=5e-5), None), task
        config = dict(parsed.tables[f"config-{i}"])
        assert (config["command"], config["domain_column"], config["data"]) == ("ppl", "path", data["config"]["data"])
    rows = parsed.tables["comparison-0"][1:]
    pair = compared(ca, cb)["comparisons"][0]
    assert [(r[0], r[1]) for r in rows] == [(task, "bits_per_byte") for task in pair["tasks"]] and len(rows) == 5
    for row, d in zip(rows, pair["tasks"].values()):
        assert [_number(c) for c in row[2:7]] == [d["n"], *(pytest.approx(d[k], abs=5e-5)
                                                          for k in ("a", "b", "diff", "diff_stderr"))]
    assert "b − a in bits_per_byte, with its 95% interval" in parsed.svg_text
    assert set(pair["tasks"]) <= set(parsed.svg_text)


def _direct_scores(run, task: str, logged: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(correct, other) scores computed here from the samples: a native task's per-request Parquet (loglikelihood
    per character), an lm-eval task's samples as lm-eval logged them (each choice's loglikelihood)."""
    if not logged:
        t = pq.read_table(run / "samples" / f"{task}.parquet").to_pydict()
        score = np.array(t["loglikelihood"]) / np.array(t["norm_len"])
        correct = np.array(t["req_idx"]) == np.array(t["gold"])
        return score[correct], score[~correct]
    lls = [([r[0][0] for r in s["resps"]], int(s["target"])) for s in logged if s["filter"] == "none"]
    return (np.array([ll[gold] for ll, gold in lls]),
            np.array([x for ll, gold in lls for k, x in enumerate(ll) if k != gold]))


def test_a_score_distribution_per_multiple_choice_task_per_run_drawn_from_its_samples(runs, page):
    """Each run's charts are its multiple-choice tasks', named by task, counting the samples' documents and other
    choices; the scores drawn are the samples' (native Parquet, raylm's Parquet of lm-eval's samples, lm-eval's
    jsonl), computed here without raylm."""
    a, b, theirs_a, theirs_b = runs
    parsed = Page(page)
    assert set(parsed.distributions) == {0, 1}
    for i, (run, theirs) in enumerate(((a, theirs_a), (b, theirs_b))):
        configs = json.loads((run / "results.json").read_text())["configs"]
        expected = {t for t, c in configs.items() if c["output_type"] == "multiple_choice"}
        assert len(expected) == MULTIPLE_CHOICE and "hellaswag" in expected and "wikitext" not in expected
        charts = {next(t for t in texts if t in expected): texts for texts in parsed.distributions[i]}
        assert set(charts) == expected and len(parsed.distributions[i]) == MULTIPLE_CHOICE
        for task in expected:
            correct, other = _direct_scores(run, task, theirs["samples"].get(task, []))
            docs, choices = {"hellaswag": (4, 4), "boolq_local": (3, 2), "piqa_local": (6, 2)}.get(task, (6, 4))
            assert len(correct) == docs and len(other) == (choices - 1) * len(correct)
            assert f"{len(correct)} correct, {len(other)} other" in charts[task]
            files = ([run / "samples" / f"{task}.parquet"] if task == "hellaswag" else
                     [run / "samples" / f"{task}_docs.parquet", *(run / "samples").glob(f"samples_{task}_*.jsonl")])
            assert len(files) == (1 if task == "hellaswag" else 2)
            for path in files:
                drawn = choice_scores(path)
                assert drawn.score == (PER_CHARACTER if task == "hellaswag" else SUMMED)
                assert drawn.score in charts[task]  # the axis says which score
                np.testing.assert_allclose(np.sort(drawn.correct), np.sort(correct), rtol=1e-12)
                np.testing.assert_allclose(np.sort(drawn.other), np.sort(other), rtol=1e-12)


def test_the_page_loads_nothing_and_escapes_what_results_say(runs, tmp_path):
    a, _, _, _ = runs
    hostile = tmp_path / "<b>run"
    shutil.copytree(a, hostile)
    data = json.loads((hostile / "results.json").read_text())
    data["config"]["model"] = "<script>alert(1)</script>"
    data["results"]["<img src=http://example.com/x.png>"] = data["results"].pop("hellaswag")
    (hostile / "results.json").write_text(json.dumps(data))
    text, refused = report_page(find_runs(hostile))
    parsed = Page(text)
    assert refused is None and parsed.title == f"raylm report: {hostile}"
    assert dict(parsed.tables["config-0"])["model"] == "<script>alert(1)</script>"  # shown as text
    assert "<img src=http://example.com/x.png>" in [row[0] for row in parsed.tables["results-0"]]
    assert "<img src=http://example.com/x.png>" in parsed.svg_text  # in the metrics chart, escaped by matplotlib
    assert not [tag for tag, _ in parsed.tags if tag in ("script", "img", "link", "iframe", "object", "b")]
    for tag, attrs in parsed.tags:
        for name in ("src", "href", "xlink:href"):
            assert (attrs.get(name) or "#").startswith("#"), (tag, attrs)  # links inside the page only
    assert not re.search(r"url\((?!#)", text) and "@import" not in text  # clip paths by id, no fetched style


def test_a_corpus_uri_a_results_file_holds_is_shown_without_its_secret():
    """A results file written before corpus URIs were stored redacted may hold the secret: the page never does."""
    uri = "s3://AKIDPAGE:page%2BSecret@corpora/mix/*.parquet?endpoint_override=http://127.0.0.1:9000"
    text, refused = report_page([Run("ppl-run", {"results": {}, "config": {"command": "ppl", "data": uri}}, {})])
    shown = "s3://***@corpora/mix/*.parquet?endpoint_override=http://127.0.0.1:9000"
    assert refused is None and dict(Page(text).tables["config-0"])["data"] == shown
    assert "AKIDPAGE" not in text and "Secret" not in text


def test_runs_without_samples_are_shown_and_the_refusal_said(runs, tmp_path, capsys):
    a, b, _, _ = runs
    for run in (a, b):
        shutil.copy(run / "results.json", tmp_path / f"{run.name}.json")
        (tmp_path / run.name).mkdir()
        shutil.copy(run / "results.json", tmp_path / run.name / "results.json")
    out = tmp_path / "pages" / "report.html"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(out)]) == 0
    assert "runs not compared" in capsys.readouterr().err
    parsed = Page(out.read_text())
    assert {"results-0", "results-1"} <= set(parsed.tables) and "comparison-0" not in parsed.tables
    assert "Not compared:" in out.read_text() and "no task with per-document samples in common" in out.read_text()


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def chromium(environ: Mapping[str, str], path: str = CHROMIUM) -> str:
    """The headless browser the page test drives. Where none is installed the test skips, in one line saying how to
    install one, so the README's two commands pass on a machine without a browser; where CI=true (.ci/run sets it,
    as hosted CI does) it fails instead, so CI keeps the check."""
    if Path(path).is_file():
        return path
    message = f"no headless browser at {path}: apt-get install chromium"
    if environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (required where CI=true)", pytrace=False)
    pytest.skip(message)


@pytest.mark.parametrize("ci", [None, "false", "true"])
def test_the_page_test_skips_without_a_browser_saying_how_to_install_one_except_under_ci(tmp_path, ci):
    environ = {} if ci is None else {"CI": ci}
    outcome = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(outcome, match=r"apt-get install chromium"):
        chromium(environ, str(tmp_path / "chromium"))
    (tmp_path / "chromium").write_text("")
    assert chromium(environ, str(tmp_path / "chromium")) == str(tmp_path / "chromium")


def test_headless_chromium_renders_the_page(runs, corpus_runs, tmp_path):
    """Debian's chromium (.ci/run installs it): the DOM it builds holds the title, the tables' rows and the
    charts, and its screenshot is a picture of the page. Two evaluations and two corpus runs: each kind's pair."""
    browser = [chromium(os.environ), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    a, b, _, _ = runs
    out = tmp_path / "report.html"
    assert main(["report", str(a), str(b), *map(str, corpus_runs), "--output", str(out)]) == 0
    dom = subprocess.run([*browser, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered, written = Page(dom.stdout), Page(out.read_text())
    assert rendered.title == written.title and rendered.title.startswith("raylm report: ")
    assert rendered.tables == written.tables and len(rendered.tables["results-0"]) > 10
    assert [row[0] for row in rendered.tables["comparison-1"][1:]] == ["ppl", *(f"ppl/{f}" for f in sorted(CORPUS_FILES)),
                                                                      "ppl macro"]
    assert rendered.svgs == written.svgs == 3 + 2 * MULTIPLE_CHOICE  # the pairs' two, the metrics', distributions
    shot = tmp_path / "page.png"
    proc = subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1200,1600", out.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert _png_size(shot) == (1200, 1600) and shot.stat().st_size > 20_000  # a drawn page, not a blank one
