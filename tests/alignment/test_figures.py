"""Figures (issue 18): matplotlib's object API without pyplot; PNG by default, PDF on request."""

from __future__ import annotations

import subprocess
import sys

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


def test_no_pyplot_on_the_simulate_path(tmp_path):
    code = (
        "import sys; from privalign.cli import main; "
        "rc = main(['simulate', '--synthetic', '3,16', '--max-log2-n', '2', '--replicates', '2', '--out', "
        f"{str(tmp_path)!r}, '--no-progress']); assert rc == 0; assert 'matplotlib.figure' in sys.modules; "
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy_reward.png", "results.json", "true_lift.png"]


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
