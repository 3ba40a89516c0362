"""The explorable builder and the exercise-check machinery (chapter 02's checks are in test_exercises_ch02.py)."""

import ipywidgets as widgets
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
import torch

import attn_course as ac
from attn_course.exercises import Feedback, call, exercise, expect_close


def _figure(**values):
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.set_title(str(values))
    return fig


def _links():
    from ipywidgets.widgets import widget as widget_module

    registry = widget_module._instances  # every live widget, by model id
    return [w for w in registry.values() if isinstance(w, widgets.widgets.widget_link.Link)]


def test_explorable_precomputes_every_view_and_links_with_jslink():
    box = ac.explorable(_figure, {"temperature": [0.5, 1, 2]})
    control, stack = box.children
    assert isinstance(control, widgets.SelectionSlider) and isinstance(stack, widgets.Stack)
    assert len(stack.children) == 3 and all(isinstance(c, widgets.Image) and bytes(c.value).startswith(b"\x89PNG") for c in stack.children)
    # Distinct pictures for distinct values.
    assert len({bytes(c.value) for c in stack.children}) == 3
    links = _links()
    assert any(l.source == (control, "index") and l.target == (stack, "selected_index") for l in links)


def test_explorable_with_two_parameters_nests_stacks():
    box = ac.explorable(_figure, {"layer": [0, 1], "head": [0, 1, 2]}, kinds={"layer": "dropdown", "head": "buttons"})
    layer_control, head_control, outer = box.children
    assert isinstance(layer_control, widgets.Dropdown) and isinstance(head_control, widgets.ToggleButtons)
    # Sized to their contents: ipywidgets' default width cut long options (chapter 07's sentences) off.
    assert layer_control.layout.width == "max-content" and head_control.style.button_width == "auto"
    assert len(outer.children) == 2 and all(len(inner.children) == 3 for inner in outer.children)
    links = _links()
    for inner in outer.children:
        assert any(l.source == (head_control, "index") and l.target == (inner, "selected_index") for l in links)


def test_explorable_can_keep_every_view_the_same_size():
    import struct

    def labelled(word):  # labels of different lengths: cropped views differ in size
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, 1])
        ax.set_yticks([0, 1], labels=[word, word])
        fig.subplots_adjust(left=0.4)
        return fig

    def sizes(box):
        return {struct.unpack(">II", bytes(c.value)[16:24]) for c in box.children[1].children}

    words = {"word": ["a", "a much longer label"]}
    assert len(sizes(ac.explorable(labelled, words, dpi=100))) == 2
    assert sizes(ac.explorable(labelled, words, dpi=100, tight=False)) == {(300, 200)}  # 3 x 2 inches at 100 dpi


def test_explorable_refuses_too_many_views():
    with pytest.raises(ValueError, match="views"):
        ac.explorable(_figure, {"a": list(range(10)), "b": list(range(10))})


# --- the exercise machinery ---------------------------------------------------------------------

@exercise("demo", hint="add one")
def _check_add_one(fn):
    expect_close(call(fn, torch.tensor([1.0])), torch.tensor([2.0]), what="fn([1.0])")
    return "fine"


@pytest.mark.parametrize(
    "answer, status, text",
    [
        (lambda t: t + 1, "correct", "fine"),
        (lambda t: t + 2, "incorrect", "expected 2.0000, got 3.0000"),
        (lambda t: 1 / 0, "error", "ZeroDivisionError"),
        (lambda t: None, "not attempted", "Not attempted yet"),
        (..., "not attempted", "Not attempted yet"),
        (lambda t: (_ for _ in ()).throw(NotImplementedError()), "not attempted", "Not attempted yet"),
        (lambda t: [2.0], "incorrect", "expected a torch.Tensor, got list"),
    ],
)
def test_feedback_statuses(answer, status, text):
    feedback = _check_add_one(answer)
    assert isinstance(feedback, Feedback)
    assert feedback.status == status
    assert text in str(feedback)
    assert bool(feedback) == (status == "correct")
    assert "Traceback" not in str(feedback)
    if status in ("incorrect", "error"):
        assert "Hint: add one" in str(feedback)


def test_a_crash_names_the_inputs_it_failed_on():
    feedback = _check_add_one(lambda t: 1 / 0)
    assert feedback.status == "error" and "(called with t of shape (1,))" in feedback.message, str(feedback)
    assert "Traceback" not in str(feedback)
