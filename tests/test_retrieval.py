"""Skill retrieval (issue 18): scorers, modes, replay, budgets, distractors, importer, PSG/CSI parsing."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from selskill.benchmarks.alfworld import load_alfworld_skills
from selskill.benchmarks.bfcl import load_bfcl_skills
from selskill.skills import Skill, SkillLibrary, load_skills
from selskill.skills.distractors import (
    APP_F_SIZES,
    BENCHMARK_TERMS,
    CAPACITY,
    distractor_skills,
    library_of_size,
    terms_in,
    with_distractors,
)
from selskill.skills.importer import import_skill_folder, skill_markdown, snake_name
from selskill.skills.loader import NAME_RE, parse_skill
from selskill.skills.pseudo_skills import (
    CAPABILITY_CHECK_INSTRUCTION,
    capability_prompt,
    checkpoint_message,
    generate_pseudo_skills,
    parse_capabilities,
    parse_capability_check,
    parse_pseudo_skill,
    pseudo_skill_prompt,
)
from selskill.skills.retrieval import RetrievalConfig, SkillRetriever, round_robin, select_within_budget
from selskill.skills.scorers import (
    BM25Scorer,
    FusedScorer,
    count_tokens,
    dense_unavailable,
    minmax,
    order_by_score,
    ranks,
    rrf,
    tokenize,
    truncate_tokens,
)
from selskill.skills.step_records import (
    EpisodePrefix,
    RecordConfig,
    Step,
    build_record,
    step_text,
    text_step,
)


def _skill(name: str, description: str, body: str = "Do it.") -> Skill:
    return Skill(name=name, description=description, kind="memory", body=body)


def _heat_prefix() -> EpisodePrefix:
    p = EpisodePrefix(task="put a hot potato in countertop", observation="You are in the middle of a room.")
    for command, obs in (
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a potato 1."),
        ("take potato 3 from countertop 1", "Nothing happens."),
        ("take potato 1 from countertop 1", "You pick up the potato 1 from the countertop 1."),
        ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
    ):
        p = p.extend(text_step(command, obs), observation=obs)
    return p


# --- text and scorers ---------------------------------------------------------------------------


def test_tokenize_splits_camel_and_snake_case_and_stems():
    assert tokenize("pressBrakePedal") == ["press", "brake", "pedal"]
    assert tokenize("heat_object heated heating") == ["heat", "object", "heat", "heat"]
    assert tokenize("the files of a directory") == ["file", "directory"]


def test_count_and_truncate_tokens():
    assert count_tokens("go to fridge 1, then open it.") == 9
    text = "one two three four five"
    assert truncate_tokens(text, 3) == "one two three"
    assert truncate_tokens(text, 10) == text
    assert count_tokens(truncate_tokens("a, b; c d e f", 4)) == 4


def test_bm25_ranks_the_matching_document_first():
    docs = [
        "Heat the object you are holding with a microwave.",
        "Cool the object you are holding with a fridge.",
        "Send a message to a user by name.",
    ]
    scorer = BM25Scorer(docs)
    s = scorer.score("heat the potato in the microwave")
    assert int(np.argmax(s)) == 0 and s[0] > 0
    assert s[2] == 0.0  # no shared term
    assert scorer.score("message a user")[2] > max(scorer.score("message a user")[:2])
    assert np.all(scorer.score("the of and") == 0)  # stopwords only: an empty query
    assert np.all(scorer.score("zebra") == 0)  # unknown term


def test_ranks_are_competition_ranks_and_rrf_sums_reciprocals():
    assert ranks(np.array([0.5, 0.9, 0.5, 0.1])).tolist() == [2, 1, 2, 4]
    fused = rrf([np.array([1, 2, 3]), np.array([3, 1, 2])], k=60)
    expected = [1 / 61 + 1 / 63, 1 / 62 + 1 / 61, 1 / 63 + 1 / 62]
    assert np.allclose(fused, expected)
    with pytest.raises(ValueError):
        rrf([])


class _Fixed:
    def __init__(self, values):
        self.values = np.asarray(values, dtype=float)
        self.n = len(values)

    def score(self, query):
        return self.values


def test_fused_scorer_rrf_and_weighted():
    a, b = _Fixed([3.0, 2.0, 1.0]), _Fixed([0.1, 0.9, 0.5])
    rrf_scores = FusedScorer([a, b], "rrf", rrf_k=60).score("q")
    assert np.allclose(rrf_scores, [1 / 61 + 1 / 63, 1 / 62 + 1 / 61, 1 / 63 + 1 / 62])
    weighted = FusedScorer([a, b], "weighted", weight=0.25).score("q")
    assert np.allclose(weighted, 0.25 * minmax(a.values) + 0.75 * minmax(b.values))
    with pytest.raises(ValueError):
        FusedScorer([a, b], "max")


def test_order_breaks_ties_by_name():
    names = ["b", "a", "c"]
    assert order_by_score(np.array([1.0, 1.0, 2.0]), names) == [2, 1, 0]


def test_minmax_round_robin_and_budget_selection():
    assert minmax(np.array([2.0, 2.0])).tolist() == [0.0, 0.0]
    assert minmax(np.array([1.0, 3.0, 2.0])).tolist() == [0.0, 1.0, 0.5]
    assert round_robin([["a", "b", "c"], ["b", "d"], ["e"]], 10) == ["a", "b", "e", "d", "c"]
    assert round_robin([["a", "b", "c"], ["d", "e"]], 3) == ["a", "d", "b"]
    cost = {"a": 500, "b": 900, "c": 400, "d": 100, "e": 50}.__getitem__
    assert select_within_budget(["a", "b", "c", "d", "e"], cost, k=3, budget=1000) == ["a", "c", "d"]
    assert select_within_budget(["b", "a"], cost, k=1, budget=1000) == ["b"]


# --- the explicit record B_t --------------------------------------------------------------------


def test_trajectory_record_lists_goal_completed_and_failed():
    text = build_record(_heat_prefix())
    assert text.splitlines()[0] == "Goal: put a hot potato in countertop"
    assert "Completed:\n- go to countertop 1 -> You arrive at countertop 1." in text
    assert "Failed:\n- take potato 3 from countertop 1 -> Nothing happens." in text
    assert text.index("go to countertop 1") < text.index("go to microwave 1")


def test_record_stays_within_its_budget_dropping_oldest_completed_first():
    p = EpisodePrefix(task="find the mug")
    for i in range(60):
        p = p.extend(Step(f"go to drawer {i}", f"You arrive at drawer {i}. On it, you see nothing."))
    p = p.extend(Step("take mug 9 from drawer 3", "Nothing happens.", failed=True))
    cfg = RecordConfig(budget=64)
    text = build_record(p, cfg)
    assert count_tokens(text) <= 64
    assert "go to drawer 59" in text and "go to drawer 0 " not in text
    assert "take mug 9 from drawer 3" in text  # failures outlive old completed actions
    tiny = build_record(EpisodePrefix(task="word " * 100), RecordConfig(budget=10))
    assert count_tokens(tiny) <= 10 and tiny.startswith("Goal: word")


def test_api_record_keeps_six_latest_calls_and_six_latest_failures():
    p = EpisodePrefix(task="first request", goal="latest request", api=True)
    for i in range(10):
        p = p.extend(
            Step(f"ok_{i}()", "{}", kind="call"), Step(f"bad_{i}()", '{"error": "no"}', True, "call")
        )
    text = build_record(p, RecordConfig(budget=10_000))
    assert text.startswith("Goal: latest request")
    recent, failed = text.split("Failed calls:")
    assert re.findall(r"- (\w+)\(\)", recent) == ["ok_7", "bad_7", "ok_8", "bad_8", "ok_9", "bad_9"]
    assert re.findall(r"- (\w+)\(\)", failed) == [f"bad_{i}" for i in range(4, 10)]


def test_step_text_is_the_last_action_and_the_end_of_the_observation():
    p = EpisodePrefix(task="t", observation="x" * 2000).extend(Step("ls()"), observation="y" * 1500)
    text = step_text(p, chars=1200)
    assert text.startswith("ls()\n") and text.endswith("y" * 1200) and len(text) == 5 + 1200


# --- the modes: purity, budgets, SkillDreamer's merge -----------------------------------------------


def _big_library() -> SkillLibrary:
    return library_of_size(load_alfworld_skills(), 300, seed=1)


def test_listing_is_a_pure_function_of_the_prefix():
    lib = _big_library()
    prefix = _heat_prefix()
    later = prefix.extend(
        Step("heat potato 1 with microwave 1", "You heat the potato 1 using the microwave 1.")
    )
    for mode in ("all", "task", "progress"):
        cfg = RetrievalConfig(mode=mode)
        a, b = SkillRetriever(lib, cfg), SkillRetriever(lib, cfg)
        first = a.listing(prefix)
        a.listing(later)  # scoring another prefix in between changes nothing
        assert a.listing(prefix) == first == b.listing(prefix)
    task = SkillRetriever(lib, RetrievalConfig(mode="task"))
    assert task.listing(prefix).names == task.listing(later).names  # once per episode


def test_progress_listing_follows_the_record_and_respects_k_and_budget():
    lib = _big_library()
    r = SkillRetriever(lib, RetrievalConfig(mode="progress"))
    listing = r.listing(_heat_prefix())
    assert len(listing.names) == 3 and listing.names == tuple(listing.ranked[:3])
    assert "heat_object" in listing.names
    assert sum(r.cost(n) for n in listing.names) <= 1200
    assert listing.query.startswith("Goal: put a hot potato")
    # a budget that fits only small skills skips the big ones, and never overflows
    tight = SkillRetriever(lib, RetrievalConfig(mode="progress", budget_tokens=120))
    small = tight.listing(_heat_prefix())
    assert sum(tight.cost(n) for n in small.names) <= 120
    assert all(tight.cost(n) <= 120 for n in small.names)
    # the record itself counted within C_K leaves less for skills
    counted = SkillRetriever(lib, RetrievalConfig(mode="progress", budget_tokens=400, record_in_budget=True))
    got = counted.listing(_heat_prefix())
    assert sum(counted.cost(n) for n in got.names) + count_tokens(got.query) <= 400
    assert r.listing(_heat_prefix()).to_row() == {
        "retrieval_mode": "progress",
        "listed_skills": list(listing.names),
    }


def test_demote_invoked_sends_used_memory_skills_last():
    lib = load_alfworld_skills()
    p = EpisodePrefix(task="put a spraybottle in drawer").extend(
        Step("pick_and_place", lib["pick_and_place"].body, kind="skill")
    )
    plain = SkillRetriever(lib, RetrievalConfig(mode="progress")).progress_ranking(p)
    demoted = SkillRetriever(lib, RetrievalConfig(mode="progress", demote_invoked="memory")).progress_ranking(
        p
    )
    assert plain[0] == "pick_and_place" and demoted[-1] == "pick_and_place"
    assert sorted(plain) == sorted(demoted)


def test_all_mode_lists_the_library_or_its_first_names():
    lib = _big_library()
    assert SkillRetriever(lib).listing(EpisodePrefix("t")).names == lib.names
    assert (
        SkillRetriever(lib, RetrievalConfig(all_limit=5)).listing(EpisodePrefix("t")).names == lib.names[:5]
    )


def test_task_mode_merges_per_capability_lists_round_robin():
    lib = _big_library()
    r = SkillRetriever(lib, RetrievalConfig(mode="task"))
    direct = r.listing(EpisodePrefix("put a hot potato in countertop"))
    assert len(direct.names) == 5 and len(direct.ranked) == 15 and "heat_object" in direct.names
    pseudo = ["Heat an object with the microwave.", "Find a desk lamp and switch it on."]
    merged = r.task_ranking("put a hot potato in countertop", pseudo)
    assert len(merged) == 15 and len(set(merged)) == 15
    assert {"heat_object", "examine_with_light"} <= set(merged[:4])
    per = SkillRetriever(lib, RetrievalConfig(mode="task", per_capability=2, merged=15))
    assert len(per.task_ranking("put a hot potato in countertop", pseudo)) <= 4
    swapped = SkillRetriever(lib, RetrievalConfig(mode="task", alpha_on="task"))
    assert swapped.task_ranking("put a hot potato in countertop", pseudo)[0] == "heat_object"


def test_config_refuses_unknown_values():
    with pytest.raises(ValueError):
        RetrievalConfig(mode="sometimes")
    with pytest.raises(ValueError):
        RetrievalConfig(record_weight=2.0)
    with pytest.raises(ValueError):
        RecordConfig(style="free")


@pytest.mark.skipif(dense_unavailable() is not None, reason="all-MiniLM-L6-v2 is not available offline")
def test_dense_scorer_ranks_by_meaning_and_is_batch_independent():
    from selskill.skills.scorers import DenseEncoder

    enc = DenseEncoder()
    lib = load_alfworld_skills()
    r = SkillRetriever(lib, RetrievalConfig(mode="progress", scorer="dense"), encoder=enc)
    assert r.progress_ranking(EpisodePrefix("warm up the potato"))[0] == "heat_object"
    one = enc.encode(["a lamp on the desk"])[0]
    fresh = type(enc)()
    both = fresh.encode(["something much longer than the other text in the batch", "a lamp on the desk"])
    assert np.array_equal(one, both[1])
    fused = SkillRetriever(lib, RetrievalConfig(mode="progress", scorer="fused"), encoder=enc)
    assert fused.progress_ranking(EpisodePrefix("chill the apple"))[0] == "cool_object"


# --- distractors ---------------------------------------------------------------------------------


def test_distractors_are_deterministic_nested_and_scale_to_a_thousand():
    a, b = distractor_skills(1000, seed=3), distractor_skills(1000, seed=3)
    assert a == b and len({s.name for s in a}) == 1000 and CAPACITY >= 1000
    assert distractor_skills(50, seed=3) == a[:50]  # nested: 28 is inside 38 is inside 68
    assert [s.name for s in distractor_skills(50, seed=4)] != [s.name for s in a[:50]]
    with pytest.raises(ValueError):
        distractor_skills(CAPACITY + 1)


@pytest.mark.parametrize(
    ("n", "seed", "digest"),
    [
        (10, 0, "5a103b9e6147105a50c7d5db2445f30c0a59f14ecb553ed884320b66eb17e0a5"),
        (68, 1, "d69445987b9c14620bf68fc9e4ea10aa828b1ec741a58cb137d1e3bece479f36"),
        (250, 7, "1d761579ecc8272ac2732d8cd8ca52f22221d278b14de200c635813d6002b7cb"),
        (1274, 0, "e305194286db8c9cb102d0b2ffa71b3c6c69acf7f85f8dbf3731487d7cb47986"),
    ],
)
def test_distractors_are_the_same_skills_as_recorded(n, seed, digest):
    """A library at one size and seed is a published setting: its skills never change wording."""
    rows = [[s.name, s.description, s.body, s.path, s.kind] for s in distractor_skills(n, seed)]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == digest


def test_distractors_are_valid_memory_skills_with_when_to_use_text():
    for s in distractor_skills(200, seed=0):
        assert NAME_RE.fullmatch(s.name) and s.kind == "memory"
        assert "Use it when" in s.description
        assert parse_skill(skill_markdown(s), "x", expected_name=s.name).description == s.description


def test_distractors_share_no_domain_word_with_either_benchmark():
    alfworld = pytest.importorskip("alfworld.gen.constants")
    household = {o.lower() for o in set(alfworld.OBJECTS) | set(alfworld.RECEPTACLES)}
    own = set(load_alfworld_skills()) | set(load_bfcl_skills())
    for s in distractor_skills(CAPACITY, seed=0):
        text = f"{s.name.replace('_', ' ')} {s.description} {s.body}"
        assert not terms_in(text), (s.name, terms_in(text))
        assert not set(re.findall(r"[a-z]+", text.lower())) & household, s.name
        assert s.name not in own


def test_app_f_listings():
    bfcl = load_bfcl_skills()
    sizes = [len(library_of_size(bfcl, n, seed=0)) for n in APP_F_SIZES]
    assert sizes == [18, 28, 38, 68]
    assert set(bfcl) <= set(library_of_size(bfcl, 68))
    assert set(library_of_size(bfcl, 28)) <= set(library_of_size(bfcl, 38))
    with pytest.raises(ValueError):
        library_of_size(bfcl, 10)
    assert len(with_distractors(bfcl, 0)) == 18
    assert "order" in BENCHMARK_TERMS


# --- importer --------------------------------------------------------------------------------------


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_import_skill_folder(tmp_path):
    src = tmp_path / "public"
    _write(
        src / "pdf-editing" / "SKILL.md",
        "---\nname: pdf-editing\ndescription: Edit PDF files.\n  Use when asked to fill forms.\n"
        "license: MIT\nallowed-tools: [Bash]\n---\n# PDF\n\nUse pypdf.\n",
    )
    _write(src / "pdf-editing" / "scripts" / "fill.py", "print(1)\n")
    _write(src / "nested" / "2d-art" / "SKILL.md", "---\nname: 2D Art\ndescription: Draw.\n---\nSteps.\n")
    _write(src / "other" / "pdf_editing" / "SKILL.md", "---\ndescription: Again.\n---\nBody two.\n")
    _write(src / "nodesc" / "SKILL.md", "---\nname: nodesc\n---\nBody.\n")
    _write(src / "nofront" / "SKILL.md", "Just text.\n")
    _write(src / "empty" / "SKILL.md", "---\nname: empty\ndescription: Nothing.\n---\n\n")
    out = tmp_path / "out"
    report = import_skill_folder(src, out, max_body_chars=200)
    names = sorted(s.name for s in report.skills)
    assert names == ["pdf_editing", "pdf_editing_2", "skill_2d_art"]
    assert {r.split(":")[0] for _, r in report.skipped} == {"no_description", "front_matter", "empty_body"}
    assert report.other_files == 1
    lib = load_skills(out)
    assert set(lib) == set(names) and all(s.kind == "memory" for s in lib.values())
    # a name taken twice is numbered in path order: other/pdf_editing comes before pdf-editing
    assert lib["pdf_editing"].description == "Again."
    assert lib["pdf_editing_2"].description == "Edit PDF files. Use when asked to fill forms."
    assert lib["pdf_editing_2"].body == "# PDF\n\nUse pypdf."
    with pytest.raises(FileExistsError):
        import_skill_folder(src, out)
    assert len(import_skill_folder(src, out, overwrite=True).written) == 3
    cut = import_skill_folder(src, max_body_chars=3)
    assert (
        cut.library["pdf_editing_2"].body.startswith("# P")
        and "truncated" in cut.library["pdf_editing_2"].body
    )


def test_import_skills_cli(tmp_path, capsys):
    from selskill.cli import main

    _write(tmp_path / "src" / "a-b" / "SKILL.md", "---\nname: a-b\ndescription: Do a.\n---\nHow.\n")
    assert (
        main(["import-skills", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--prefix", "pub_"]) == 0
    )
    assert "imported 1 skills" in capsys.readouterr().out
    assert list(load_skills(tmp_path / "o")) == ["pub_a_b"]


def test_import_stays_inside_the_source_and_skips_oversized_files(tmp_path, capsys, monkeypatch):
    """A link that leaves the source is skipped, file or folder; one that stays inside is followed;
    a SKILL.md over the size cap is skipped on its size, never read."""
    from selskill.cli import main

    skill = "---\nname: {}\ndescription: Do {}.\n---\nHow.\n"
    _write(tmp_path / "secret" / "SKILL.md", skill.format("secret", "secret"))
    src = tmp_path / "src"
    _write(src / "real" / "SKILL.md", skill.format("real", "real"))
    (src / "leak").mkdir()
    (src / "leak" / "SKILL.md").symlink_to(tmp_path / "secret" / "SKILL.md")
    (src / "leak_dir").symlink_to(tmp_path / "secret", target_is_directory=True)
    (src / "alias").mkdir()
    (src / "alias" / "SKILL.md").symlink_to(src / "real" / "SKILL.md")
    (src / "loop").symlink_to(src, target_is_directory=True)  # inside, and a cycle: walked once
    _write(src / "huge" / "SKILL.md", skill.format("huge", "huge") + "x" * 5000)
    read = []  # the size of each file a read was asked of
    original = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(os.fstat(fd).st_size) or original(fd, n))

    report = import_skill_folder(src, max_file_bytes=1000)
    assert sorted(s.description for s in report.skills) == ["Do real.", "Do real."]  # alias and real
    skipped = dict(report.skipped)
    assert skipped[str(src / "leak" / "SKILL.md")].startswith("outside_source: ")
    assert skipped[str(src / "leak_dir")].startswith("outside_source: ")
    assert skipped[str(src / "huge" / "SKILL.md")].startswith("too_large: ")
    assert read and max(read) < 1000 and "secret" not in str(report.sources)

    assert main(["import-skills", str(src), "--out", str(tmp_path / "o"), "--max-file-bytes", "1000"]) == 0
    out = capsys.readouterr()
    assert "outside_source=2" in out.out and "too_large=1" in out.out
    assert f"skipped {src / 'leak' / 'SKILL.md'}: outside_source" in out.err
    assert len(import_skill_folder(src, max_file_bytes=None).skills) == 3  # no cap: huge is read


def test_snake_name():
    assert snake_name("PDF Editing") == "pdf_editing"
    assert snake_name("--x--y--") == "x_y"
    assert snake_name("3d") == "skill_3d"
    assert snake_name("!!!") == ""


# --- SkillDreamer's prompts ---------------------------------------------------------------------------


def test_capability_parsing_line_json_and_list_forms():
    text = "<think>hmm</think>CAPABILITY: Heat food\ncapability 2: find objects\nCAPABILITY: heat food\nANCHORS: potato; countertop"
    caps = parse_capabilities(text)
    assert caps.capabilities == ("Heat food", "find objects") and caps.anchors == ("potato", "countertop")
    js = parse_capabilities('```json\n{"capabilities": ["a", {"name": "b"}], "anchors": ["x"]}\n```')
    assert js.capabilities == ("a", "b") and js.anchors == ("x",)
    listed = parse_capabilities("1. one\n2. two\n- three\n* four\n5) five\n6. six")
    assert listed.capabilities == ("one", "two", "three", "four", "five")
    assert parse_capabilities("no idea").capabilities == ()


def test_generate_pseudo_skills_with_any_generator():
    prompts = []

    def fake(prompt: str) -> str:
        prompts.append(prompt)
        if "step 1" in prompt:
            return "CAPABILITY: heating\nCAPABILITY: placing\nANCHORS: potato"
        return "" if "placing" in prompt else "NAME: heat_food\nWHEN TO USE: when hot food is asked for."

    out = generate_pseudo_skills("put a hot potato in countertop", fake)
    assert out.capabilities == ("heating",) and out.skills[0].startswith("NAME: heat_food")
    assert out.anchors == ("potato",) and len(prompts) == 3
    assert "put a hot potato" in capability_prompt("put a hot potato") and "at most 5" in capability_prompt(
        "x"
    )
    assert "Semantic anchors: a; b" in pseudo_skill_prompt("t", "c", ["a", "b"])
    assert parse_pseudo_skill("```\nNAME: x\n```") == "NAME: x"
    assert out.to_dict()["skills"] == list(out.skills)


def test_capability_check_parsing():
    text = (
        "SUBGOAL: heat it\nEVIDENCE: I hold potato 1\nCAPABILITY: heating\n"
        "DECISION: MATCH heat_object\nNEXT: call heat_object; success: the potato is hot\n<tool_call>..."
    )
    got = parse_capability_check(text)
    assert got["decision"] == "MATCH" and got["skill"] == "heat_object" and got["subgoal"] == "heat it"
    assert (
        parse_capability_check(text.replace("MATCH heat_object", "PARTIAL_MATCH: x"))["decision"]
        == "PARTIAL_MATCH"
    )
    assert parse_capability_check("SUBGOAL: a\nNEXT: b") is None
    assert parse_capability_check(text.replace("MATCH heat_object", "MAYBE")) is None
    assert "SUBGOAL" in CAPABILITY_CHECK_INSTRUCTION and "NO_CAPABILITY_GAP" in CAPABILITY_CHECK_INSTRUCTION
    assert "step 3 of at most 10; 7 left" in checkpoint_message(3, 10)


# --- the benchmark's labels ---------------------------------------------------------------------------


def test_bfcl_relevance_and_replayed_events():
    pytest.importorskip("bfcl_eval")
    from selskill.benchmarks.bfcl.retrieval_bench import (
        _function_classes,
        bfcl_episodes,
        bfcl_relevant,
        workflow_functions,
    )
    from selskill.skills.retrieval_bench import evaluate, format_table, parse_sizes

    lib = load_bfcl_skills()
    fns, flows = _function_classes(), workflow_functions(lib)
    assert bfcl_relevant("post_tweet", ["TwitterAPI"], fns, flows) == {"twitter_reference", "post_tweet"}
    assert bfcl_relevant("cd", ["GorillaFileSystem", "TwitterAPI"], fns, flows) == {"file_system_reference"}
    assert bfcl_relevant("cd", ["TwitterAPI"], fns, flows) == frozenset()
    episodes = bfcl_episodes(lib, categories=["base"], split="test", limit=3)
    assert len(episodes) == 3 and all(ep.events for ep in episodes)
    ep = episodes[0]
    assert ep.events[0].prefix.steps == () and ep.events[-1].prefix.steps  # prefixes grow, never look ahead
    assert all(s.kind == "call" for s in ep.events[-1].prefix.steps)
    r = SkillRetriever(lib, RetrievalConfig(mode="progress"))
    row = evaluate(episodes, r, "progress")
    assert (
        row["events"] == sum(len(e.events) for e in episodes)
        and 0 <= row["R@1"] <= row["R@3"] <= row["R@5"] <= 1
    )
    assert evaluate(episodes, r, "all")["R@5"] is not None
    table = format_table([{"env": "bfcl", "size": 18, "mode": "progress", "scorer": "bm25", **row}])
    assert table.count("\n") == 2
    assert parse_sizes("own,68,10,68", 18) == [18, 68]


def test_bench_retrieval_parser():
    from selskill.cli import build_parser
    from selskill.skills.retrieval_bench import RetrievalBench, retrieval_options

    args = build_parser().parse_args(
        ["bench", "retrieval", "--envs", "bfcl", "--scorers", "bm25", "--sizes", "own"]
    )
    from selskill.cli_commands import bench

    assert args.envs == ["bfcl"] and args.scorers == ["bm25"] and args.func is bench._retrieval
    # every flag reaches the run's settings, and the flags' defaults are the settings' defaults, each
    # benchmark's own (its options, contributed by its plugin) included
    defaults = {name: options() for name, options in retrieval_options().items()}
    assert set(defaults) == {"alfworld", "bfcl"}
    assert RetrievalBench.from_args(args) == RetrievalBench(
        envs=("bfcl",), scorers=("bm25",), sizes="own", options=defaults
    )
    args = build_parser().parse_args(
        ["bench", "retrieval", "--bfcl-split", "train", "--bfcl_limit", "3", "--alfworld-per-type", "2"]
    )
    got = RetrievalBench.from_args(args)
    assert got.envs == ("alfworld", "bfcl")  # every benchmark with a retrieval bench, in the registry's order
    assert (got.options["bfcl"].bfcl_split, got.options["bfcl"].bfcl_limit) == ("train", 3)
    assert got.options["alfworld"].alfworld_per_type == 2


def test_import_skips_link_loops_and_special_files_counting_each_reason(tmp_path, capsys):
    """`ln -s SKILL.md s/SKILL.md`, a loop of two folder links, a dangling link and a FIFO named SKILL.md
    are each skipped with their reason and counted; the rest is imported; a YAML alias bomb is refused."""
    from selskill.cli import main

    src = tmp_path / "src"
    _write(src / "ok" / "SKILL.md", "---\nname: ok\ndescription: Fine.\n---\nHow.\n")
    (src / "s").mkdir()
    (src / "s" / "SKILL.md").symlink_to("SKILL.md")
    (src / "x").symlink_to("y")
    (src / "y").symlink_to("x")
    (src / "gone").mkdir()
    (src / "gone" / "SKILL.md").symlink_to(tmp_path / "nowhere")
    (src / "f").mkdir()
    os.mkfifo(src / "f" / "SKILL.md")
    bomb = ['a0: &a0 "lol"'] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    _write(src / "bomb" / "SKILL.md", "---\n" + "\n".join(bomb) + "\nname: x\ndescription: *a9\n---\nb\n")

    report = import_skill_folder(src)
    assert [s.name for s in report.skills] == ["ok"]
    reasons = {Path(p).relative_to(src).as_posix(): r.split(":")[0] for p, r in report.skipped}
    assert reasons == {
        "s/SKILL.md": "link_loop",
        "x": "link_loop",
        "y": "link_loop",
        "gone/SKILL.md": "broken_link",
        "f/SKILL.md": "not_a_file",
        "bomb/SKILL.md": "front_matter",
    }
    assert "YAML aliases" in dict(report.skipped)[str(src / "bomb" / "SKILL.md")]

    assert main(["import-skills", str(src), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr()
    assert (
        "imported 1 skills, skipped 6 (broken_link=1, front_matter=1, link_loop=3, not_a_file=1)" in out.out
    )
    assert f"skipped {src / 'f' / 'SKILL.md'}: not_a_file: a FIFO" in out.err
    assert list(load_skills(tmp_path / "o")) == ["ok"]
