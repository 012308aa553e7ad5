"""A failing browser test leaves a screenshot of each page and the text of open dialogs."""

from __future__ import annotations

import os

import pytest

from support.browser import ARTIFACTS, chromium, has_chromium, save_failure_artifacts

pytestmark = [pytest.mark.browser, pytest.mark.skipif(not has_chromium(), reason="needs /usr/bin/chromium")]


def test_every_open_page_is_saved_with_its_dialogs_text():
    with chromium() as browser:
        page = browser.new_page()
        page.set_content('<div class="jp-Dialog"><h2>Select Kernel</h2><p>Kernel: Python 3</p></div>')
        saved = save_failure_artifacts("tests/test_x.py::test_y[a b]")
    names = sorted(p.name for p in saved)
    assert names == [
        "FAILED-tests_test_x.py__test_y_a_b_-page0.png",
        "FAILED-tests_test_x.py__test_y_a_b_-page0.txt",
    ]
    assert (ARTIFACTS / names[0]).stat().st_size > 0
    text = (ARTIFACTS / names[1]).read_text()
    assert "open dialog: Select Kernel Kernel: Python 3" in text
    for path in saved:
        path.unlink()


@pytest.mark.slow
def test_the_hook_runs_when_a_browser_test_fails(pytester, monkeypatch):
    """Through pytest itself, with this suite's conftest: a failing `browser` test's report names the
    page saved while its fixtures still held it open."""
    tests = ARTIFACTS.parent / "tests"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests), str(tests.parent)]))
    pytester.makepyfile(
        """
        import pytest
        from support.browser import chromium

        @pytest.fixture
        def page():
            with chromium() as browser:
                page = browser.new_page()
                page.set_content('<div class="jp-Dialog">Kernel Restarting</div>')
                yield page

        @pytest.mark.browser
        def test_fails(page):
            assert False
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "conftest", "-p", "no:cacheprovider", "-o", "markers=browser: x"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert (
        "browser artefacts" in out
        and "FAILED-test_the_hook_runs_when_a_browser_test_fails.py__test_fails-page0.png" in out
    )
    text = ARTIFACTS / "FAILED-test_the_hook_runs_when_a_browser_test_fails.py__test_fails-page0.txt"
    assert "open dialog: Kernel Restarting" in text.read_text()
    for path in ARTIFACTS.glob("FAILED-test_the_hook_runs_when_a_browser_test_fails.py__test_fails-*"):
        path.unlink()
