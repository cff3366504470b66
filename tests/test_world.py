"""The shapes world: rendering, grammar, parser, scene sampling and prompt sets."""

import json
import math

import numpy as np
import pytest

from solbench.errors import ConfigError
from solbench.world import grammar, prompts, scenes
from solbench.world.grammar import ObjectRequirement, PromptParseError, Relation, Requirements


def test_render_is_deterministic_and_in_range():
    a = grammar.sample_scene(grammar.parse_prompt("three red circles"), np.random.default_rng(7))
    b = grammar.sample_scene(grammar.parse_prompt("three red circles"), np.random.default_rng(7))
    assert a == b
    img_a, img_b = scenes.render_scene(a), scenes.render_scene(b)
    assert img_a.shape == (3, 32, 32) and img_a.dtype == np.float32
    assert np.array_equal(img_a, img_b)
    assert img_a.min() >= 0 and img_a.max() <= 1
    batch = scenes.render_batch([a, b])
    assert tuple(batch.shape) == (2, 3, 32, 32)


@pytest.mark.parametrize("shape, area", [("circle", math.pi * 25), ("square", 100.0), ("triangle", 50.0)])
def test_rendered_coverage_matches_the_shape_area(shape, area):
    # A size-10 shape: the anti-aliased coverage integrates to its area (circle pi r^2, triangle s^2 / 2).
    x, y = np.meshgrid(np.arange(32) + 0.5, np.arange(32) + 0.5, indexing="xy")
    coverage = scenes.shape_coverage(shape, x, y, 15.3, 16.7, 10.0)
    assert coverage.sum() == pytest.approx(area, rel=0.03)


def test_triangle_points_up():
    x, y = np.meshgrid(np.arange(32) + 0.5, np.arange(32) + 0.5, indexing="xy")
    cov = scenes.shape_coverage("triangle", x, y, 16.0, 16.0, 12.0)
    rows = cov.sum(axis=1)
    assert rows[11] < rows[16] < rows[21]  # narrow near the apex (top), wide at the base


def test_sampled_scenes_respect_sizes_gaps_bounds_and_relations():
    rng = np.random.default_rng(0)
    for _ in range(300):
        req = grammar.sample_requirements(rng)
        scene = grammar.sample_scene(req, rng)
        assert len(scene.objects) == sum(o.count for o in req.objects)
        for i, obj in enumerate(scene.objects):
            assert scenes.MIN_SIZE <= obj.size <= scenes.MAX_SIZE
            x0, y0, x1, y1 = obj.box()
            assert min(x0, y0) >= scenes.BORDER - 1e-9 and max(x1, y1) <= 32 - scenes.BORDER + 1e-9
            for other in scene.objects[i + 1:]:
                assert scenes.boxes_separated(obj, other, scenes.MIN_GAP - 1e-9)
        if req.relation is not None:
            rel = req.relation
            subj = next(o for o in scene.objects if (o.colour, o.shape) == (req.objects[rel.subject].colour, req.objects[rel.subject].shape))
            ref = next(o for o in scene.objects if (o.colour, o.shape) == (req.objects[rel.reference].colour, req.objects[rel.reference].shape))
            ux, uy = grammar.RELATION_DIRECTION[rel.relation]
            dx, dy = subj.cx - ref.cx, subj.cy - ref.cy
            assert (dx * ux + dy * uy) / math.hypot(dx, dy) >= math.cos(math.radians(grammar.POSITION_MAX_ANGLE_DEG)) - 1e-9


def test_parser_round_trips_the_whole_grammar():
    total = 0
    for skill in grammar.SKILLS:
        for req in grammar.enumerate_requirements(skill):
            assert grammar.parse_prompt(grammar.caption(req)) == req
            total += 1
    assert total == 12 + 36 + 72 + 528  # single, counting (2-4), colour pairs, position pairs x 4 relations


def test_parser_normalises_and_reads_structure():
    req = grammar.parse_prompt("  A photo of a Green circle   left of a red square. ")
    assert req == Requirements(
        "position", (ObjectRequirement("green", "circle"), ObjectRequirement("red", "square")), Relation(0, "left of", 1)
    )
    count = grammar.parse_prompt("four blue triangles")
    assert count.objects == (ObjectRequirement("blue", "triangle", 4, exact=True),)


@pytest.mark.parametrize("bad", ["a purple circle", "five red circles", "a cat", "a red circle near a blue square", ""])
def test_parser_rejects_prompts_outside_the_grammar(bad):
    with pytest.raises(PromptParseError, match="not in the shapes grammar"):
        grammar.parse_prompt(bad)


def test_canonical_key_identifies_equivalent_wordings():
    a = grammar.parse_prompt("a red circle left of a blue square")
    b = grammar.parse_prompt("a blue square right of a red circle")
    c = grammar.parse_prompt("a blue square left of a red circle")
    assert a.canonical_key() == b.canonical_key() != c.canonical_key()
    assert grammar.parse_prompt("a red circle and a blue square").canonical_key() == \
        grammar.parse_prompt("a blue square and a red circle").canonical_key()


def test_hard_negatives_change_the_meaning_and_stay_in_the_grammar():
    rng = np.random.default_rng(3)
    for _ in range(500):
        req = grammar.sample_requirements(rng)
        neg = grammar.hard_negative(req, rng)
        assert neg.canonical_key() != req.canonical_key()
        assert grammar.parse_prompt(grammar.caption(neg)) == neg


# -- prompt sets


@pytest.mark.parametrize("split", prompts.SPLITS)
def test_prompt_sets_load_parse_and_have_unique_ids(split):
    records = prompts.load_prompt_set(f"shapes/{split}")
    assert len({r.id for r in records}) == len(records)
    for r in records:
        assert grammar.parse_prompt(r.text).skill == r.skill
    if split != "train":
        counts = {s: sum(r.skill == s for r in records) for s in grammar.SKILLS}
        assert counts == prompts.EVAL_PER_SKILL


def test_prompt_sets_are_disjoint_up_to_wording():
    keys = {s: {grammar.parse_prompt(r.text).canonical_key() for r in prompts.load_prompt_set(f"shapes/{s}")}
            for s in prompts.SPLITS}
    assert not keys["train"] & keys["eval"]
    assert not keys["train"] & keys["heldout"]
    assert not keys["eval"] & keys["heldout"]


def test_shipped_prompt_files_match_their_generator():
    built = prompts.build_shapes_splits()
    for split in prompts.SPLITS:
        assert prompts.load_prompt_set(f"shapes/{split}") == built[split]


def test_grammar_draw_is_seeded_fresh_and_loads_by_name():
    # Bugs caught: a "fresh" draw that overlaps the sets the weights and recipes were tuned on (eval,
    # heldout), repeats a prompt up to wording, or changes between calls with the same seed.
    drawn = prompts.load_prompt_set("shapes/draw26")
    assert drawn == prompts.grammar_draw(26) and drawn != prompts.grammar_draw(27)
    counts = {s: sum(r.skill == s for r in drawn) for s in grammar.SKILLS}
    assert counts == {"single_object": 6, "counting": 8, "color_attr": 8, "position": 8}  # 6 single objects left
    keys = [grammar.parse_prompt(r.text).canonical_key() for r in drawn]
    assert len(set(keys)) == len(keys) == 30
    assert all(grammar.parse_prompt(r.text).skill == r.skill for r in drawn)
    tuned = {grammar.parse_prompt(r.text).canonical_key() for s in ("eval", "heldout")
             for r in prompts.load_prompt_set(f"shapes/{s}")}
    assert not set(keys) & tuned
    assert [r.id for r in drawn[:2]] == ["draw26-0000", "draw26-0001"]
    assert drawn[0].text == "a yellow square" and drawn[-1].text == "a blue circle below a yellow circle"
    with pytest.raises(ConfigError, match="draw<SEED>"):
        prompts.load_prompt_set("shapes/drawx")


def test_prompt_files_from_paths(tmp_path):
    txt = tmp_path / "mine.txt"
    txt.write_text("a red circle\n\n a dog on a beach \n")
    recs = prompts.load_prompt_set(str(txt))
    assert [r.text for r in recs] == ["a red circle", "a dog on a beach"]
    assert [r.id for r in recs] == ["mine-00000", "mine-00001"]
    jl = tmp_path / "pick.jsonl"
    jl.write_text(json.dumps({"id": "p1", "text": "a cat"}) + "\n" + json.dumps({"text": "a dog"}) + "\n")
    recs = prompts.load_prompt_set(jl)
    assert [(r.id, r.text, r.skill) for r in recs] == [("p1", "a cat", None), ("pick-00001", "a dog", None)]


def test_prompt_files_are_utf8_split_on_newlines_only(tmp_path):
    # Pick-a-Pic prompts carry emojis, accents and the odd U+2028; Windows files CRLF and a BOM.
    txt = tmp_path / "train.txt"
    txt.write_bytes("\ufeffa caf\u00e9 \U0001f348\r\nline\u2028separator inside\r\n\r\nzdzis\u0142aw\n".encode("utf-8"))
    recs = prompts.load_prompt_set(txt)
    assert [r.text for r in recs] == ["a caf\u00e9 \U0001f348", "line\u2028separator inside", "zdzis\u0142aw"]
    assert [r.id for r in recs] == ["train-00000", "train-00001", "train-00002"] and {r.skill for r in recs} == {None}
    jl = tmp_path / "test.jsonl"
    jl.write_text(json.dumps({"text": "a \u2028 b", "skill": "art"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [(r.id, r.text, r.skill) for r in prompts.load_prompt_set(jl)] == [("test-00000", "a \u2028 b", "art")]
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="UTF-8"):
        prompts.load_prompt_set(latin1)


def test_prompt_jsonl_records_are_checked(tmp_path):
    def load(*records):
        path = tmp_path / "set.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return prompts.load_prompt_set(path)

    with pytest.raises(ConfigError, match=r"set.jsonl: prompt id 'a' is used by records 1 and 3"):
        load({"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"})
    with pytest.raises(ConfigError, match="prompt id 'set-00001'"):  # an explicit id equal to a default one
        load({"id": "set-00001", "text": "x"}, {"text": "y"})
    with pytest.raises(ConfigError, match=r"set.jsonl:2: 'text' must be a non-empty string"):
        load({"text": "x"}, {"text": 3})
    with pytest.raises(ConfigError, match=r"set.jsonl:1: 'text' must be a non-empty string"):
        load({"text": "  "})
    with pytest.raises(ConfigError, match=r"set.jsonl:1: 'skill' must be a string"):
        load({"text": "x", "skill": 2})


def test_prompt_set_errors_say_what_and_where(tmp_path):
    with pytest.raises(ConfigError, match="shapes/validation"):
        prompts.load_prompt_set("shapes/validation")
    with pytest.raises(ConfigError, match="neither a named set"):
        prompts.load_prompt_set(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        prompts.load_prompt_set(bad)
    csv = tmp_path / "p.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"\.txt .* or \.jsonl"):
        prompts.load_prompt_set(csv)
