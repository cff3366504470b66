"""The shapes detector: ground truth is judged correct, hand-made wrong scenes are not."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solbench.world import detector, grammar, scenes
from solbench.world.scenes import ObjectSpec, SceneSpec


def _image(*objects, background=0.05):
    return scenes.render_batch([SceneSpec(tuple(objects), background)])


def _score(images, prompt, strict):
    return float(detector.score_images(images, [prompt] * images.shape[0], strict=strict)[0])


RED_LEFT = ObjectSpec("circle", "red", 10, 8, 16)
BLUE_RIGHT = ObjectSpec("square", "blue", 10, 24, 16)


@pytest.fixture(scope="module")
def ground_truth():
    rng = np.random.default_rng(2024)
    reqs = [grammar.sample_requirements(rng) for _ in range(400)]
    images = scenes.render_batch([grammar.sample_scene(r, rng) for r in reqs])
    return images, [grammar.caption(r) for r in reqs]


def test_strict_accuracy_on_rendered_ground_truth_is_perfect(ground_truth):
    images, captions = ground_truth
    assert detector.score_images(images, captions, strict=True).mean().item() == 1.0


def test_graded_score_of_ground_truth_is_high(ground_truth):
    images, captions = ground_truth
    graded = detector.score_images(images, captions, strict=False)
    assert graded.min().item() > 0.9
    assert graded.dtype == torch.float32 and graded.shape == (400,)


def test_blurred_ground_truth_is_still_mostly_correct(ground_truth):
    # Generated samples are soft; a Gaussian blur (sigma 0.7 px) stands in for that.
    images, captions = ground_truth
    taps = torch.exp(-0.5 * (torch.arange(-2, 3, dtype=torch.float32) / 0.7) ** 2)
    k = (taps[:, None] * taps[None, :]) / taps.sum() ** 2
    blurred = F.conv2d(F.pad(images, (2, 2, 2, 2), mode="replicate"), k.expand(3, 1, 5, 5).contiguous(), groups=3)
    assert detector.score_images(blurred, captions, strict=True).mean().item() >= 0.95


def test_detections_report_class_and_geometry():
    (found,) = detector.detect(_image(RED_LEFT, BLUE_RIGHT))
    by_colour = {d.colour: d for d in found}
    assert set(by_colour) == {"red", "blue"}
    assert by_colour["red"].shape == "circle" and by_colour["blue"].shape == "square"
    assert by_colour["red"].cx == pytest.approx(8, abs=0.3) and by_colour["red"].cy == pytest.approx(16, abs=0.3)
    assert by_colour["blue"].width == pytest.approx(10, abs=0.5)


def test_counting_right_and_wrong():
    three = _image(*(ObjectSpec("circle", "red", 9, x, y) for x, y in [(7, 7), (24, 8), (15, 24)]))
    assert _score(three, "three red circles", strict=True) == 1.0
    assert _score(three, "three red circles", strict=False) > 0.9
    # Wrong count: soft count 3 for 2 gives 1 - |3 - 2| / 2 = 0.5 at best.
    assert _score(three, "two red circles", strict=True) == 0.0
    assert _score(three, "two red circles", strict=False) == pytest.approx(0.5, abs=0.05)
    assert _score(three, "four red circles", strict=False) == pytest.approx(0.75, abs=0.05)
    # Wrong colour or shape: nothing matches.
    assert _score(three, "three blue circles", strict=False) == 0.0
    assert _score(three, "three red squares", strict=False) < 0.1


def test_colour_attribution_swapped_binding_scores_low():
    img = _image(ObjectSpec("square", "blue", 10, 8, 10), ObjectSpec("triangle", "yellow", 11, 23, 20))
    assert _score(img, "a blue square and a yellow triangle", strict=True) == 1.0
    assert _score(img, "a yellow square and a blue triangle", strict=True) == 0.0
    assert _score(img, "a yellow square and a blue triangle", strict=False) < 0.1
    # Half right: one requirement met, one not -> about 0.5.
    assert _score(img, "a blue square and a green triangle", strict=False) == pytest.approx(0.5, abs=0.05)


def test_position_right_and_wrong():
    img = _image(RED_LEFT, BLUE_RIGHT)
    assert _score(img, "a red circle left of a blue square", strict=True) == 1.0
    assert _score(img, "a blue square right of a red circle", strict=True) == 1.0
    assert _score(img, "a red circle left of a blue square", strict=False) > 0.9
    for wrong in ("a red circle right of a blue square", "a red circle above a blue square"):
        assert _score(img, wrong, strict=True) == 0.0
        # Objects present (2 of 3 requirements), relation score 0: about 2/3.
        assert _score(img, wrong, strict=False) == pytest.approx(2 / 3, abs=0.05)


def test_relation_margin_is_genevals_rule():
    # Centres 16 px apart on x, boxes 10 + 10 wide: offset shrinks by 0.1 * 20 = 2 -> 14 / 16.
    a = detector.DetectedObject("red", "circle", {}, 8, 16, 10, 10, 80, 1.0)
    b = detector.DetectedObject("blue", "square", {}, 24, 16, 10, 10, 100, 1.0)
    assert detector.relation_margin(a, b, "left of") == pytest.approx(14 / 16)
    assert detector.relation_margin(a, b, "right of") == pytest.approx(-14 / 16)
    assert detector.relation_margin(a, b, "above") == pytest.approx(0.0)
    # 45 degrees down-right: each axis offset 12 shrinks to 10, over the distance 16.97 -> 0.589,
    # above GenEval's 0.5: "left of" (and "above") both hold on a diagonal.
    c = detector.DetectedObject("blue", "square", {}, 20, 28, 10, 10, 100, 1.0)
    assert detector.relation_margin(a, c, "left of") == pytest.approx(10 / np.hypot(12, 12))


def test_empty_and_grey_images_score_zero():
    grey = torch.full((2, 3, 32, 32), 0.4)
    for prompt in ("a red circle", "three green squares", "a red circle left of a blue square"):
        assert _score(grey, prompt, strict=True) == 0.0
        assert _score(grey, prompt, strict=False) == 0.0


def test_graded_score_falls_as_a_shape_degrades():
    # A square morphing into a circle: the "square" score must fall monotonically-ish, continuously.
    x, y = np.meshgrid(np.arange(32) + 0.5, np.arange(32) + 0.5, indexing="xy")
    scores = []
    for w in np.linspace(0, 1, 5):
        cov = (1 - w) * scenes.shape_coverage("square", x, y, 16, 16, 11) + w * scenes.shape_coverage("circle", x, y, 16, 16, 11)
        img = 0.05 + cov[None] * (np.array(scenes.COLOURS["green"])[:, None, None] - 0.05)
        scores.append(_score(torch.from_numpy(img[None].astype(np.float32)), "a green square", strict=False))
    assert scores[0] > 0.9 and scores[-1] < 0.3
    assert all(a >= b - 1e-6 for a, b in zip(scores, scores[1:]))
    assert len(set(np.round(scores, 4))) >= 4  # graded, not 2-valued


def test_inputs_are_checked():
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        detector.score_images(torch.zeros(2, 32, 32), ["a red circle"] * 2, strict=True)
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        detector.score_images(torch.zeros(2, 3, 32, 32), ["a red circle"], strict=True)
