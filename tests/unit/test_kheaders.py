"""Header resolution on fixture trees: no root, no real /lib/modules."""
from __future__ import annotations

import os

import pytest

from sitsprobe import kheaders
from sitsprobe.errors import HeadersNotFound, SitsprobeError

RELEASE = "6.18.44-fc-v782"


def debian_pair(root, abi: str, flavour: str = "cloud-amd64", upstream: str | None = None):
    """/usr/src/linux-headers-<abi>-<flavour> plus its -common tree, as Debian ships them."""
    src = root / "usr/src"
    common = src / f"linux-headers-{abi}-common"
    build = src / f"linux-headers-{abi}-{flavour}"
    (common / "include/linux").mkdir(parents=True)
    (build / "include/generated").mkdir(parents=True)
    (build / "include/config").mkdir(parents=True)
    (build / "Makefile").write_text(f"include /usr/src/linux-headers-{abi}-common/Makefile\n")
    (build / "include/generated/utsrelease.h").write_text(
        f'#define UTS_RELEASE "{abi}-{flavour}"\n')
    if upstream:
        (build / "include/config/kernel.release").write_text(upstream + "\n")
    return str(build), str(common)


def test_host_tree_wins(tmp_path):
    build = tmp_path / f"lib/modules/{RELEASE}/build"
    build.mkdir(parents=True)
    debian_pair(tmp_path, "6.1.0-50")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert (choice.kind, choice.build, choice.source) == ("host", str(build), None)
    assert kheaders.install(choice, root=str(tmp_path)) is None


def test_host_link_to_other_release_is_called_a_mismatch(tmp_path):
    build, _ = debian_pair(tmp_path, "6.1.0-50")
    modules = tmp_path / f"lib/modules/{RELEASE}"
    modules.mkdir(parents=True)
    os.symlink(build, modules / "build")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert choice.kind == "host" and choice.mismatch
    assert "for 6.1.0-50-cloud-amd64, the kernel is 6.18.44-fc-v782" in choice.note


def test_kheaders_next(tmp_path):
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/kheaders.tar.xz").write_bytes(b"")
    debian_pair(tmp_path, "6.1.0-50")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert choice.kind == "kheaders" and choice.build is None
    assert kheaders.install(choice, root=str(tmp_path)) is None


def test_configured_tree_pairs_with_debian_common(tmp_path):
    debian_pair(tmp_path, "6.1.0-50")
    debian_pair(tmp_path, "6.12.0-3", upstream="6.12.20")  # nearer, but not configured
    choice = kheaders.resolve(RELEASE, root=str(tmp_path),
                              configured="/usr/src/linux-headers-6.1.0-50-cloud-amd64")
    assert choice.kind == "configured"
    assert choice.build == str(tmp_path / "usr/src/linux-headers-6.1.0-50-cloud-amd64")
    assert choice.source == str(tmp_path / "usr/src/linux-headers-6.1.0-50-common")
    assert "unsafe" in choice.note


def test_configured_missing_says_so(tmp_path):
    with pytest.raises(HeadersNotFound, match="kernel_headers: /opt/nope is not a directory"):
        kheaders.resolve(RELEASE, root=str(tmp_path), configured="/opt/nope")


def test_nearest_picks_closest_version_with_generated_headers(tmp_path):
    debian_pair(tmp_path, "5.10.0-30", upstream="5.10.200")
    debian_pair(tmp_path, "6.1.0-50", upstream="6.1.176")
    debian_pair(tmp_path, "6.19.0-1", upstream="6.19.2")
    debian_pair(tmp_path, "6.17.0-2", upstream="6.17.9")
    # closest of all, but a bare tree without include/generated: not buildable
    (tmp_path / "usr/src/linux-headers-6.18.40-bare/include").mkdir(parents=True)
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert choice.kind == "nearest" and choice.mismatch
    assert choice.build.endswith("linux-headers-6.17.0-2-cloud-amd64")
    assert choice.source.endswith("linux-headers-6.17.0-2-common")
    assert "programs that read kernel structs field by field are unsafe" in choice.note
    assert "tracepoint arguments and user memory are fine" in choice.note


def test_nearest_prefers_an_exact_release(tmp_path):
    debian_pair(tmp_path, "6.17.0-2")
    exact, _ = debian_pair(tmp_path, "6.18.44", flavour="fc-v782")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert choice.build == exact
    assert not choice.mismatch and "unsafe" not in choice.note


def test_nearest_uses_upstream_version_not_abi_name(tmp_path):
    # Debian's 6.1.0-50 is upstream 6.1.176: nearer to 6.1.170 than 6.1.0-1's 6.1.4
    debian_pair(tmp_path, "6.1.0-1", upstream="6.1.4")
    debian_pair(tmp_path, "6.1.0-50", upstream="6.1.176")
    choice = kheaders.resolve("6.1.170-custom", root=str(tmp_path))
    assert choice.build.endswith("linux-headers-6.1.0-50-cloud-amd64")


def test_none_found_says_what_was_searched_and_what_to_do(tmp_path):
    with pytest.raises(HeadersNotFound) as e:
        kheaders.resolve(RELEASE, root=str(tmp_path))
    msg = str(e.value)
    for part in (f"lib/modules/{RELEASE}/build", "kheaders.tar.xz", "usr/src",
                 "mount the host's /lib/modules and /usr/src", f"linux-headers-{RELEASE}",
                 "kernel_headers"):
        assert part in msg


def test_install_links_build_and_source(tmp_path):
    build, common = debian_pair(tmp_path, "6.1.0-50")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    note = kheaders.install(choice, root=str(tmp_path))
    modules = tmp_path / f"lib/modules/{RELEASE}"
    assert os.readlink(modules / "build") == build
    assert os.readlink(modules / "source") == common
    assert note.startswith(f"linked {modules}/build -> {build}")
    # after linking, the same tree is found as the host's, and install is a no-op
    again = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert again.kind == "host" and "unsafe" in again.note
    assert kheaders.install(choice, root=str(tmp_path)) is None


def test_install_never_overwrites_a_build(tmp_path):
    debian_pair(tmp_path, "6.1.0-50")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    modules = tmp_path / f"lib/modules/{RELEASE}"
    modules.mkdir(parents=True)
    os.symlink(theirs, modules / "build")
    note = kheaders.install(choice, root=str(tmp_path))
    assert os.readlink(modules / "build") == str(theirs)
    assert not (modules / "source").exists()
    assert "left" in note and "as it is" in note


def test_install_refuses_a_dangling_build_link(tmp_path):
    debian_pair(tmp_path, "6.1.0-50")
    modules = tmp_path / f"lib/modules/{RELEASE}"
    modules.mkdir(parents=True)
    os.symlink("/nonexistent/headers", modules / "build")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    assert choice.kind == "nearest"
    with pytest.raises(HeadersNotFound, match="which is missing; mount that tree"):
        kheaders.install(choice, root=str(tmp_path))
    assert os.readlink(modules / "build") == "/nonexistent/headers"


def test_install_failure_names_path_and_remedy(tmp_path):
    debian_pair(tmp_path, "6.1.0-50")
    (tmp_path / "lib").write_text("a file where a directory should be")
    choice = kheaders.resolve(RELEASE, root=str(tmp_path))
    with pytest.raises(SitsprobeError, match="cannot link .*build.*make .* writable"):
        kheaders.install(choice, root=str(tmp_path))
