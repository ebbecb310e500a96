"""native: a C source compiled once into the cache, loaded with ctypes; a failing or missing compiler gives None
and one line saying why (callers then keep their torch path)."""

import ctypes

import pytest

from posenc_bench import native

SOURCE = "double twice(double x) { return 2 * x; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native._load.cache_clear()
    yield tmp_path / "posenc-bench" / "native"
    native._load.cache_clear()


def test_a_source_compiles_once_into_the_cache_and_loads(cache):
    if native._compiler() is None:
        pytest.skip("no C compiler here")
    lib = native.load("twice", SOURCE)
    assert lib is not None and native.why_not("twice", SOURCE) == ""
    lib.twice.restype, lib.twice.argtypes = ctypes.c_double, [ctypes.c_double]
    assert lib.twice(1.25) == 2.5
    built = sorted(cache.iterdir())
    assert len(built) == 1 and built[0].name.startswith("twice-") and built[0].suffix == ".so"  # no temporaries
    stamp = built[0].stat().st_mtime_ns
    native._load.cache_clear()  # a new process: the library is found, not compiled again
    assert native.load("twice", SOURCE) is not None and built[0].stat().st_mtime_ns == stamp
    assert native.load("twice", SOURCE + "\n// edited\n") is not None  # another source: its own file
    assert len(list(cache.iterdir())) == 2


def test_a_source_that_does_not_compile_gives_none_and_the_compilers_line(cache):
    if native._compiler() is None:
        pytest.skip("no C compiler here")
    assert native.load("broken", "int f( {") is None
    why = native.why_not("broken", "int f( {")
    assert "failed on the broken kernel" in why and "\n" not in why
    assert not cache.exists() or not any(cache.glob("broken-*.so"))


def test_no_compiler_gives_none_and_names_it(cache, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    assert native.load("twice", SOURCE) is None
    assert native.why_not("twice", SOURCE) == "no C compiler found (${CC} or cc: 'no-such-compiler-xyz')"


def test_signatures_are_set_once_and_a_missing_library_takes_none(cache, monkeypatch):
    if native._compiler() is not None:
        lib = native.load("twice", SOURCE, {"twice": [ctypes.c_double]})
        assert lib.twice.argtypes == [ctypes.c_double]
    native._load.cache_clear()
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    assert native.load("twice", SOURCE, {"twice": [ctypes.c_double]}) is None


def test_the_compiler_version_is_one_line_and_recorded_with_the_versions():
    from posenc_bench.env import versions

    version = native.compiler_version()
    assert versions()["cc"] == version
    if native._compiler() is not None:
        assert version and "\n" not in version
