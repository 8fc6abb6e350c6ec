"""selskill report: builds from a fixture run with every section and plot, its numbers equal
the fixture's metrics, it is deterministic, and missing rounds/stages are notes, not errors."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
from fixtures_run import write_fixture_run

from selskill import report as rp
from selskill.cli import main
from selskill.measure.metrics import LABELS, METRICS, format_value, paired_sr_difference, sum_yields
from selskill.report import data as report_data
from selskill.report import plots as report_plots
from selskill.report import render as report_render

SECTIONS = [
    "# SelSkill report: fixture",
    "## Notes (skipped or missing)",
    "## Held-out metrics across rounds",
    "### Split valid_seen",
    "### Split valid_unseen",
    "## Pair yield per round",
    "### Pairs per task by kind",
    "### Pairs by kind and reason",
    "### Discarded (why no pair was kept)",
    "## Plots",
    "### Metrics per round",
    "### Entropy after the branch point: invoke vs skip arm (Figure 3 analogue)",
    "### Branch scores of local pairs by chosen arm",
    "### Skill calls per episode",
    "### Chosen vs rejected agent steps",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    exp = write_fixture_run(tmp_path_factory.mktemp("runs"), "fixture")
    return exp, rp.build_report(exp)


def md_table(md: str, heading: str) -> list[list[str]]:
    """Rows (cells) of the first Markdown table after `heading`."""
    lines = md[md.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_every_section_and_plot(built):
    exp, rep = built
    md = rep.markdown.read_text()
    html = rep.html.read_text()
    for s in SECTIONS:
        assert s + "\n" in md, s
    assert {p.name for p in rep.plots} == set(report_plots.PLOTS.values())
    for name in report_plots.PLOTS.values():
        path = exp / "plots" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](plots/{name})" in md
    # one self-contained HTML file: every plot embedded, no external image
    assert html.count('src="data:image/png;base64,') == len(report_plots.PLOTS)
    assert 'src="plots/' not in html
    for s in SECTIONS:
        assert s.lstrip("# ") in html


def _eval_rows(exp, r, split):
    rows = pq.read_table(exp / f"round_{r}" / "eval" / "shards" / "00000.parquet").to_pylist()
    return [x for x in rows if x["task_id"].startswith(f"{split}/")]


def test_metrics_table_equals_fixture_metrics(built):
    exp, rep = built
    md = rep.markdown.read_text()
    assert "| Round | Episodes | " + " | ".join(LABELS[m] for m in METRICS) + " | ΔSR vs init (pp) |" in md
    for split in ("valid_seen", "valid_unseen"):
        rows = md_table(md, f"### Split {split}")
        assert [r[0] for r in rows] == ["init", "R1", "R2"]
        for row, r in zip(rows, (0, 1, 2), strict=True):
            o = json.loads((exp / f"round_{r}" / "eval" / "metrics.json").read_text())["splits"][split][
                "overall"
            ]
            assert row[1] == str(o["episodes"])
            assert row[2 : 2 + len(METRICS)] == [format_value(m, o[m], o["ci"].get(m)) for m in METRICS]
            if r == 0:
                assert row[-1] == "-"
                continue
            d = paired_sr_difference(
                _eval_rows(exp, 0, split), _eval_rows(exp, r, split), n_boot=2000, seed=0
            )
            assert (
                row[-1] == f"{100 * d['diff']:+.1f} [{100 * d['ci'][0]:+.1f}, {100 * d['ci'][1]:+.1f}] (n=4)"
            )
    # the fixture by hand: valid_seen SR 50 -> 75 -> 100 (%), R2 vs init +50pp
    rows = md_table(md, "### Split valid_seen")
    assert [r[2].split()[0] for r in rows] == ["50.0", "75.0", "100.0"]
    assert rows[2][-1].startswith("+50.0 [")
    sr_by_type = md_table(md, "SR (%) by task type on valid_seen:")
    assert sr_by_type == [
        ["pick_and_place_simple", "100.0 (n=2)", "100.0 (n=2)", "100.0 (n=2)"],
        ["pick_heat_then_place_in_recep", "0.0 (n=2)", "50.0 (n=2)", "100.0 (n=2)"],
    ]


def test_headroom_section_renders_the_headroom_of_each_round_that_measured_it(built, tmp_path):
    from selskill.measure.headroom import skill_headroom

    exp, rep = built
    assert "Skills' headroom" not in rep.markdown.read_text()  # no metrics.json has it
    copy = tmp_path / "fixture"
    shutil.copytree(exp, copy)
    path = copy / "round_1" / "eval" / "metrics.json"
    metrics = json.loads(path.read_text())
    # round 0's episodes stand in for round 1's model without skills
    h = skill_headroom(_eval_rows(exp, 1, "valid_seen"), _eval_rows(exp, 0, "valid_seen"), n_boot=200)
    h["similarity"] = {
        "positive": {"tasks": 1, "mean": 2.5},
        "negative": {"tasks": 0, "mean": None},
        "no_effect": {"tasks": 3, "mean": 0.75},
    }
    path.write_text(json.dumps(metrics | {"headroom": {"valid_seen": h}}))
    md = rp.build_report(copy).markdown.read_text()
    section = md.split("## Skills' headroom (the paper's Appendix B)\n")[1].split("\n## ")[0]
    assert "### Split valid_seen" in section and "valid_unseen" not in section
    rows = md_table(section, "### Split valid_seen")
    assert len(rows) == 1 and rows[0][:2] == ["R1", "4"]  # round 1 only: the others did not measure it
    cells = [
        f"{h['counts'][c]} ({100 * h['shares'][c]:.1f}%)"
        for c in ("positive", "negative", "both_won", "both_lost")
    ]
    lo, hi = h["net_gain_ci"]
    net = f"{100 * h['net_gain']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    assert rows[0][2:] == [*cells, net, f"{100 * h['oracle_gain']:+.1f}", "2.50 (n=1)", "-", "0.75 (n=3)"]
    assert h["net_gain"] == pytest.approx(0.25)  # the fixture's SR 50 -> 75 on valid_seen


def test_pair_yield_equals_label_stats(built):
    exp, rep = built
    md = rep.markdown.read_text()
    y = json.loads((exp / "round_1" / "label" / "stats" / "00000.json").read_text())["yield"]
    assert md_table(md, "### Pairs per task by kind") == [
        ["R1", str(y["tasks"]), str(y["pairs"]), "1.50 (3)", "2.00 (4)", "75.0% (3)"]
    ]
    assert md_table(md, "### Pairs by kind and reason") == [
        ["R1", k, str(n), f"{n / y['tasks']:.2f}"] for k, n in sorted(y["pairs_by_reason"].items())
    ]
    assert md_table(md, "### Discarded (why no pair was kept)") == [
        ["R1", "local_both_failed", "1"],
    ]
    gaps = md_table(md, "### Chosen vs rejected agent steps")
    # agent steps: the invoke arms' skill call is one step for two commands
    assert ["R1", "local/efficiency", "3", "3.7", "6.7", "-3.0"] in gaps


def test_entropy_table_shows_invoke_hotter_than_skip(built):
    _, rep = built
    rows = md_table(rep.markdown.read_text(), "### Entropy after the branch point")
    by_arm = {r[1]: r for r in rows}
    assert by_arm["invoke"][2] == "8" and by_arm["skip"][2] == "7"  # forks per arm in the fixture
    assert float(by_arm["invoke"][4]) > float(by_arm["skip"][4])


def test_missing_stages_are_noted(built):
    _, rep = built
    assert any("round 2: no fork or label stage" in n for n in rep.notes)
    assert "round 2: no fork or label stage" in rep.markdown.read_text()


def test_deterministic(built, tmp_path):
    exp, rep = built
    copy = tmp_path / "fixture"
    shutil.copytree(exp, copy)
    rep2 = rp.build_report(copy)
    assert rep2.markdown.read_text() == rep.markdown.read_text().replace(str(exp), str(copy))
    assert rep2.html.read_text() == rep.html.read_text().replace(str(exp), str(copy))
    for name in report_plots.PLOTS.values():
        assert (copy / "plots" / name).read_bytes() == (exp / "plots" / name).read_bytes(), name


def test_missing_rounds_and_broken_inputs_never_crash(built, tmp_path):
    exp, _ = built
    copy = tmp_path / "fixture"
    shutil.copytree(exp, copy)
    shutil.rmtree(copy / "round_0")  # no init round
    shutil.rmtree(copy / "round_1" / "fork")  # no forks
    (copy / "round_2" / "eval" / "metrics.json").write_text("{not json")  # recomputed from shards
    (copy / "round_1" / "label" / "shards" / "00000.parquet").write_bytes(b"garbage")
    rep = rp.build_report(copy)
    md = rep.markdown.read_text()
    notes = "\n".join(rep.notes)
    assert "rounds [0] have no directory" in notes
    assert "round 1: no fork shards" in notes
    assert "round 2: no readable metrics.json; metrics recomputed" in notes
    assert "round 1: cannot read label shards" in notes
    assert "ΔSR vs init cannot be computed" in notes
    assert [r[0] for r in md_table(md, "### Split valid_seen")] == ["R1", "R2"]
    assert md_table(md, "### Split valid_seen")[1][2].startswith("100.0")
    names = {p.name for p in rep.plots}
    assert "branch_entropy.png" not in names and not (copy / "plots" / "branch_entropy.png").exists()
    assert "step_gap.png" not in names  # pair shard unreadable
    assert "metrics_per_round.png" in names


def test_unfinished_stage_is_reported_with_a_note(built, tmp_path):
    """A stage the contract cannot verify (a rank without its completion marker) is still read."""
    exp, rep = built
    copy = tmp_path / "fixture"
    shutil.copytree(exp, copy)
    for marker in (copy / "round_1" / "label" / "completions").iterdir():
        marker.unlink()
    rep2 = rp.build_report(copy)
    notes = "\n".join(rep2.notes)
    assert "round 1: label shards read unverified" in notes and "no completion marker" in notes
    md = rep2.markdown.read_text()
    gaps = md_table(rep.markdown.read_text(), "### Chosen vs rejected agent steps")
    assert md_table(md, "### Chosen vs rejected agent steps") == gaps


def test_empty_and_missing_experiment(tmp_path):
    (tmp_path / "empty").mkdir()
    rep = rp.build_report(tmp_path / "empty")
    assert "no round_<r> directories" in rep.markdown.read_text() and rep.plots == []
    with pytest.raises(FileNotFoundError):
        rp.build_report(tmp_path / "nope")


def test_cli(built, tmp_path, capsys):
    exp, _ = built
    copy = tmp_path / "fixture"
    shutil.copytree(exp / "round_0", copy / "round_0")  # init only: a quick report
    assert main(["report", "--exp", str(copy)]) == 0
    assert (copy / "report.md").exists() and (copy / "report.html").exists()
    assert "2 plots" in capsys.readouterr().out
    assert main(["report", "--exp", str(tmp_path / "missing")]) == 2


def test_branch_entropy_skips_forced_and_non_assistant_tokens():
    fork = {
        "arm": "invoke",
        "prefix_len": 3,
        "role": [0, 1, 2, 1, 1, 1, 3, 3, 1, 1],
        "turn": [-1, 0, 0, 1, 1, 1, 1, 1, 2, 2],
        "entropy": [0, 0.5, 0, 0, 0, 2.0, 0, 0, 1.0, 0],
        "logprob": [0, -0.1, 0, 0, 0, -0.3, 0, 0, -0.2, 0],
    }
    assert report_data.generated_after_branch(fork) == [(0, 2.0), (1, 1.0)]
    e = report_data.branch_entropy(
        [fork, fork | {"arm": "skip", "entropy": [0, 0, 0, 0, 0, 1.0, 0, 0, 3.0, 0]}]
    )
    assert e["invoke"]["tokens"] == 2 and e["invoke"]["mean"] == 1.5
    assert [p[0] for p in e["skip"]["by_position"]] == [1.0, 3.0]
    assert [p[0] for p in e["invoke"]["by_turn"]] == [2.0, 1.0]


def test_sum_yields_over_ranks():
    a = {
        "yield": {
            "tasks": 2,
            "pairs": 3,
            "pairs_by_kind": {"local": 2, "episode": 1},
            "pairs_by_reason": {"local/efficiency": 2, "episode/success_vs_failure": 1},
            "local_invoke_preferred": 1,
            "discarded": {"local_tie": 1},
        }
    }
    b = {
        "yield": {
            "tasks": 2,
            "pairs": 2,
            "pairs_by_kind": {"local": 2},
            "pairs_by_reason": {"local/efficiency": 2},
            "invoke_preferred_share": 1.0,
            "discarded": {"local_tie": 2, "local_both_failed": 0},
        }
    }
    y = sum_yields([a, b, {"rows": 0}])
    assert y["tasks"] == 4 and y["pairs"] == 5
    assert y["pairs_per_task"] == {"episode": 0.25, "local": 1.0}
    assert y["local_invoke_preferred"] == 3 and y["invoke_preferred_share"] == 0.75
    assert y["discarded"] == {"local_tie": 3}
    assert sum_yields([{"rows": 1}]) is None


def test_the_page_escapes_every_text_it_shows(tmp_path):
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.text = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

        def handle_data(self, data):
            self.text.append(data)

    texts = ["<script>alert(1)</script>", "a \"q\" & 'b'", "<b>note</b>", "<td>cell", "x | y"]
    blocks = [
        ("h", 2, texts[0]),
        ("p", texts[1]),
        ("list", [texts[2]], "notes"),
        ("table", ["h"], [[texts[3], texts[4]]]),
    ]
    page = Page()
    page.feed(report_render.to_html(blocks, tmp_path, "<title>"))
    assert set(page.tags) == {"html", "head", "meta", "title", "style", "body", "h2", "p", "ul", "li", "table",
                              "thead", "tr", "th", "tbody", "td"}  # fmt: skip
    assert page.tags.count("td") == 2 and page.tags.count("li") == 1
    assert all(t in page.text for t in ["<title>", *texts])
