"""The per-user cache folder (rotviz.user_cache) and the zoo folders built on it
(rotviz.zoo_registry): where a wheel's zoo models are read from and built into."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rotviz import zoo_registry as zoo
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.user_cache import cache_dir


@pytest.mark.parametrize("platform,env,want", [
    ("linux", {"HOME": "/h"}, "/h/.cache/rotviz"),
    ("linux", {"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/rotviz"),
    ("linux", {"HOME": "/h", "XDG_CACHE_HOME": "rel"}, "/h/.cache/rotviz"),  # XDG: absolute only
    ("darwin", {"HOME": "/h"}, "/h/Library/Caches/rotviz"),
    ("win32", {"HOME": "/h", "LOCALAPPDATA": "/l"}, "/l/rotviz/Cache"),
    ("win32", {"HOME": "/h"}, "/h/AppData/Local/rotviz/Cache"),
    ("linux", {"HOME": "/h", "ROTVIZ_CACHE": "/mine"}, "/mine"),
    ("darwin", {"HOME": "/h", "ROTVIZ_CACHE": "~/c"}, str(Path("~/c").expanduser())),
])
def test_cache_dir_is_the_platforms_unless_given(platform, env, want):
    assert cache_dir(env, platform) == Path(want)


def test_a_relative_cache_is_taken_from_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cache_dir({"ROTVIZ_CACHE": "c"}, "linux") == tmp_path / "c"


@pytest.fixture
def wheel_like(tmp_path, monkeypatch) -> Path:
    """The zoo as a wheel has it: only the default pair shipped, an empty user cache."""
    shipped = tmp_path / "shipped"
    for name in zoo.PAIRS["default"]:
        shutil.copytree(zoo.SHIPPED / name, shipped / name)
    monkeypatch.setattr(zoo, "SHIPPED", shipped)
    monkeypatch.setenv("ROTVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ROTVIZ_ZOO", raising=False)
    return tmp_path


def test_zoo_reads_the_shipped_folder_then_the_cache(wheel_like, capsys):
    cache = wheel_like / "cache" / "zoo"
    assert zoo.zoo_dirs() == [wheel_like / "shipped", cache] and zoo.build_dir() == cache
    assert zoo.path_of("vit-digits-s3") == wheel_like / "shipped" / "vit-digits-s3"
    assert not zoo.is_built("vit-digits-s7")
    with pytest.raises(RotvizError, match=r"not built \(no vit-digits-s7 in .*shipped or "
                                          r".*cache/zoo\); run: rotviz zoo build vit-digits-s7"):
        zoo.path_of("vit-digits-s7")
    shutil.copytree(zoo.SHIPPED / "vit-digits-s3", cache / "vit-digits-s7")  # a build, in place
    assert zoo.path_of("vit-digits-s7") == cache / "vit-digits-s7"
    assert zoo.where("vit-digits-s8") == cache / "vit-digits-s8"  # where a build would go
    # a shipped model is never built into the cache, where it would not be read
    assert main(["zoo", "build", "vit-digits-s6"]) == 2
    assert "ships with rotviz" in capsys.readouterr().err
    assert not (cache / "vit-digits-s6").exists()
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{wheel_like / 'shipped'} then {cache}" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("vit-")}
    assert "not built" in rows["vit-digits-s8"] and "not built" not in rows["vit-digits-s7"]


def test_rotviz_zoo_replaces_both_folders(wheel_like, monkeypatch):
    monkeypatch.setenv("ROTVIZ_ZOO", str(wheel_like / "mine"))
    assert zoo.zoo_dirs() == [wheel_like / "mine"] and zoo.build_dir() == wheel_like / "mine"
    assert not zoo.is_built("vit-digits-s3") and not zoo.shipped("vit-digits-s3")
