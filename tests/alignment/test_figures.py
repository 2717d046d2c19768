"""Figures: Pillow PNGs by default (no matplotlib import); matplotlib's object API without pyplot
for PDF or on request."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from privalign.alignment.figures import plot_results
from privalign.alignment.simulation import MethodSpec, run_protocol
from privalign.alignment.synthetic import make_synthetic_pool
from privalign.errors import PrivacyParameterError


@pytest.fixture(scope="module")
def results():
    pool = make_synthetic_pool(4, 64, random_state=0)
    specs = [
        MethodSpec("bon"),
        MethodSpec("privbon", epsilon=2.0),
        MethodSpec("privitp", beta=0.1, sigma_x=0.3, sigma_z=0.3),
    ]
    return run_protocol(
        pool, specs, n_grid=[1, 2, 4, 8, 16, 32], replicates=2, random_state=0, progress=False
    )


def test_png_by_default_pdf_on_request(tmp_path, results):
    paths = plot_results(results, tmp_path / "a")
    assert [p.name for p in paths] == ["true_lift.png", "proxy_reward.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert not list((tmp_path / "a").glob("*.pdf"))
    paths = plot_results(results, tmp_path / "b", formats=["png", "pdf"])
    assert sorted(p.name for p in paths) == [
        "proxy_reward.pdf",
        "proxy_reward.png",
        "true_lift.pdf",
        "true_lift.png",
    ]
    assert all(p.read_bytes()[:5] == b"%PDF-" for p in paths if p.suffix == ".pdf")


@pytest.mark.parametrize("formats", [(), ("svg",), ("png", "jpeg")])
def test_bad_formats(tmp_path, results, formats):
    with pytest.raises(PrivacyParameterError, match="'formats' parameter"):
        plot_results(results, tmp_path, formats=formats)


@pytest.mark.parametrize(
    ("extra", "imported"),
    [
        ([], "assert 'matplotlib' not in sys.modules, 'matplotlib imported'"),
        (
            ["--figure-backend", "matplotlib"],
            "assert 'matplotlib.figure' in sys.modules; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'",
        ),
    ],
)
def test_matplotlib_only_when_asked_and_never_pyplot(tmp_path, extra, imported):
    code = (
        "import sys; from privalign.cli import main; "
        "rc = main(['simulate', '--synthetic', '3,16', '--max-log2-n', '2', '--replicates', '2', '--out', "
        f"{str(tmp_path)!r}, '--no-progress', *{extra!r}]); assert rc == 0; {imported}"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy_reward.png", "results.json", "true_lift.png"]


def _colour_pixels(path, hex_colour, tol=40):
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(path).convert("RGB"), dtype=int)
    want = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int(np.sum(np.abs(rgb - want).sum(axis=-1) <= tol))


def test_pillow_backend_draws_every_method(tmp_path, results):
    from PIL import Image

    from privalign.alignment._raster import PALETTE

    paths = plot_results(results, tmp_path, backend="pillow")
    assert [p.name for p in paths] == ["true_lift.png", "proxy_reward.png"]
    for p in paths:
        assert Image.open(p).size == (840, 540)
        # every method's line (colour i of the cycle) is drawn, and no colour beyond the methods
        counts = [_colour_pixels(p, c) for c in PALETTE[:4]]
        assert all(c > 200 for c in counts[:3]), counts
        assert counts[3] == 0, counts


def test_pillow_backend_rejects_pdf_and_unknown_backends(tmp_path, results):
    with pytest.raises(PrivacyParameterError, match="'backend' parameter 'pillow' draws PNG only"):
        plot_results(results, tmp_path, formats=["png", "pdf"], backend="pillow")
    with pytest.raises(PrivacyParameterError, match="'backend' parameter must be one of"):
        plot_results(results, tmp_path, backend="svgwrite")


def test_simulate_pillow_with_pdf_is_a_one_line_error(tmp_path, capsys):
    from privalign.cli import main

    args = [
        "simulate",
        "--synthetic",
        "3,16",
        "--max-log2-n",
        "2",
        "--replicates",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main([*args, "--pdf", "--figure-backend", "pillow", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--figure-backend" in err[0] and "pillow" in err[0]
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_raster_handles_gaps_flat_and_single_point_series(tmp_path):
    import numpy as np
    from PIL import Image

    from privalign.alignment._raster import PALETTE, Series, render_line_chart

    series = [
        Series(
            "gap",
            np.array([1.0, 2, 4, 8]),
            np.array([0.1, np.nan, 0.3, 0.4]),
            np.array([0.01, 0.0, np.nan, 0.02]),
        ),
        Series("flat", np.array([1.0, 2, 4, 8]), np.full(4, 0.25), np.zeros(4)),
        Series("one", np.array([4.0]), np.array([-0.2])),
    ]
    path = render_line_chart(
        series, tmp_path / "c.png", title="t", xlabel="x", ylabel="y", xticks=[1, 2, 4, 8]
    )
    assert Image.open(path).size == (840, 540)
    assert all(_colour_pixels(path, c) > 20 for c in PALETTE[:3])
    # one constant series alone: a zero data range must still give a finite axis
    render_line_chart([series[1]], tmp_path / "d.png", title="t", xlabel="x", ylabel="y", xticks=[1, 8])
    render_line_chart([], tmp_path / "e.png", title="empty", xlabel="x", ylabel="y", xticks=[])
    assert Image.open(tmp_path / "e.png").size == (840, 540)


@pytest.mark.parametrize(
    ("lo", "hi", "want"),
    [(0.0, 1.0, 6), (-0.03, 0.97, 5), (0.353, 0.867, 3), (-25.0, 90.0, 5), (1e-9, 3e-9, 5), (5.0, 5.0, 1)],
)
def test_nice_ticks_cover_the_range_with_round_steps(lo, hi, want):
    from privalign.alignment._raster import nice_ticks

    t = nice_ticks(lo, hi)
    assert len(t) == want  # 3 to 6 ticks for a target of 6, as matplotlib's default locator gives
    assert t[0] >= lo - 1e-12 and t[-1] <= hi + 1e-12
    if len(t) > 1:
        step = t[1] - t[0]
        mant = step / 10 ** np.floor(np.log10(step))
        assert any(abs(mant - m) < 1e-9 for m in (1, 2, 2.5, 5)), step


def test_simulate_pdf_flag_and_pool_cache_flag(tmp_path, capsys):
    import json

    from privalign.cli import main
    from privalign.data.pools import write_pool

    path = tmp_path / "p.jsonl"
    write_pool(path, make_synthetic_pool(3, 16, random_state=0).to_records())
    for extra, n_files in (([], 2), (["--pdf"], 4), (["--no-pool-cache"], 2)):
        out = tmp_path / ("o" + "".join(extra))
        assert (
            main(
                [
                    "simulate",
                    "--pool",
                    str(path),
                    "--max-log2-n",
                    "2",
                    "--replicates",
                    "2",
                    "--out",
                    str(out),
                    "--no-progress",
                    "--json",
                    *extra,
                ]
            )
            == 0
        )
        s = json.loads(capsys.readouterr().out)
        assert len(s["figures"]) == n_files and all(out.joinpath(f).exists() for f in s["figures"])
        assert len(list(out.glob("*.pdf"))) == (2 if "--pdf" in extra else 0)
