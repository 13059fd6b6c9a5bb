"""The one table renderer: terminal tables fit 120 columns and lose no cell; markdown has every
column; a table that already fits prints as it always did."""
import re

from hypothesis import given, settings, strategies as st

from mlsys_jax.tables import MAX_WORD, WIDTH, columns, fmt, format_table, markdown_table

WIDE = [{"schedule": f"every-{k}", "formula_forwards": 64 + k, "lecture_forwards": None,
         "jax_saved_units": 3 * k, "xla_temp_bytes": 800968 // k, "jax_grads_bitwise": True,
         "note": "the backward of a layer re-runs its forward from the stored input " * (k % 3),
         "predicted_peak_bytes": 20480, "measured_peak_bytes": 20480.0 + k, "within_budget": True,
         "recompute_flops": 139264 * k, "store_all_bytes": 102408, "solve_ms": 1.5 * k}
        for k in (1, 2, 4, 8)]


def test_a_table_that_fits_prints_as_before():
    text = format_table([{"pass": "dce", "fired on": 8}, {"pass": "fold_conv_bn", "fired on": 5}],
                        title="[t]")
    assert text == ("[t]\n"
                    "  pass         | fired on\n"
                    "  -------------+---------\n"
                    "  dce          | 8\n"
                    "  fold_conv_bn | 5")


def test_a_wide_table_fits_and_loses_no_cell():
    text = format_table(WIDE, title="[wide]")
    lines = text.splitlines()
    assert max(map(len, lines)) <= WIDTH < len(markdown_table(WIDE).splitlines()[0])
    assert sum(line.startswith("  schedule ") for line in lines) >= 2  # stacked blocks, each
    for row in WIDE:                                                 # led by the first column
        for value in row.values():
            assert all(word in text for word in fmt(value).split()), value
    for name in WIDE[0]:  # a header wraps after its underscores, never inside a word
        assert all(piece in text for piece in re.findall(r"[^_ ]+_?", name)), name


def test_long_text_wraps_and_rows_are_ruled_apart():
    rows = [{"claim": "a claim " * 30, "ours": 1.5, "ok": "✓"}, {"claim": "short", "ours": 2, "ok": "✓"}]
    lines = format_table(rows).splitlines()
    assert max(map(len, lines)) <= WIDTH and len(lines) > 4
    assert any(set(line.strip()) <= {"·", "+"} for line in lines)  # a row of several lines ends


def test_markdown_keeps_every_column_in_order():
    md = markdown_table(WIDE + [{"schedule": "a|b", "formula_forwards": [1, 2]}])
    head = md.splitlines()[0]
    assert head == "| " + " | ".join(columns(WIDE)) + " |"
    assert "| a\\|b | 1, 2 |" in md and md.count("\n") == len(WIDE) + 2


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.dictionaries(
           st.sampled_from(["a", "bb_cc", "long_header_name_here", "note", "x_y_z_w", "n"]),
           st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                     st.text(st.sampled_from("ab _-|.×"), max_size=90)), min_size=1),
           min_size=1, max_size=6),
       width=st.integers(2 * MAX_WORD + 5, 200))
def test_any_table_fits_any_terminal_of_reasonable_width(rows, width):
    text = format_table(rows, width=width)
    assert max(map(len, text.splitlines())) <= width
    for row in rows:  # every word of every cell is printed whole (only longer ones are cut)
        for value in row.values():
            assert all(w in text for w in fmt(value).split() if len(w) <= MAX_WORD)
