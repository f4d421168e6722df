"""``sitsprobe doctor``: can the agent run here, and with which hooks?

It mounts what BPF needs, finds kernel headers (linking them where bcc looks),
loads and fires a tiny program of every hook kind, and says per probe point
which hook the agent will use and why not a better one.
"""
from __future__ import annotations

import json
import os
import textwrap

from sitsprobe import kheaders, tracefs
from sitsprobe.errors import SitsprobeError
from sitsprobe.probes import hooks

WIDTH, NAME = 80, 20


def nvml_status() -> dict:
    """Whether NVML answers: GPU sampling is optional, so never a problem."""
    from .gpu import available
    ok, detail = available()
    return {"ok": ok, "detail": detail if ok else f"{detail}; GPU features off, the rest runs"}


def _headers(root: str, configured: str | None, problems: list[str]) -> dict:
    try:
        choice = kheaders.resolve(root=root, configured=configured)
        linked = kheaders.install(choice, root=root)
    except SitsprobeError as e:
        problems.append(f"kernel headers: {e}")
        return {"ok": False, "detail": str(e)}
    return {"ok": True, "kind": choice.kind, "build": choice.build, "source": choice.source,
            "note": choice.note, "mismatch": choice.mismatch, "linked": linked}


def report(root: str = "/", configured_headers: str | None = None,
           usdt_binary: str | None = None) -> dict:
    """Everything doctor knows, as plain data (the JSON output)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not root: loading BPF needs root (or CAP_BPF, CAP_PERFMON and "
                        "CAP_SYS_ADMIN); run doctor as root, or the pod privileged")
    try:
        mounted = tracefs.ensure_mounted(root)
    except OSError as e:
        mounted = []
        problems.append(f"{e.strerror}: mount it on the host, or run the pod privileged")
    present = tracefs.mounts(root)
    mounts = {fs: present.get(point) == fs or fs == "tracefs" and
              os.path.isdir(os.path.join(tracefs.tracefs_path(root), "events"))
              for fs, point in tracefs.FILESYSTEMS}
    headers = _headers(root, configured_headers, problems)  # before anything compiles
    try:
        import bcc
        bcc_version = getattr(bcc, "__version__", "unknown")
    except ImportError as e:
        bcc_version = None
        problems.append(f"bcc not importable ({e}): apt-get install python3-bpfcc, and put "
                        "/usr/lib/python3/dist-packages/bcc on sys.path")
    from sitsprobe.probes import capability, net_plan

    caps = capability.probe_all(root=root, usdt_binary=usdt_binary)
    chosen = capability.plan(caps, root)
    notes = capability.fallback_notes(chosen, caps)
    # the socket tier's connections as `run` follows them (their first call and TCP state)
    net_plan.follow_connections(chosen["net"], btf_path=os.path.join(root, "sys/kernel/btf/vmlinux"))
    if bcc_version and not caps["ringbuf"].ok:
        problems.append(f"{caps['ringbuf'].detail} (ring buffers need kernel 5.8+)")
    unhooked = [point for point, hook in chosen["net"].items()
                if hook is None and point not in hooks.OPTIONAL]  # without those the agent runs, and says so
    if bcc_version and unhooked:
        problems.append(f"net probe points with no working hook: {', '.join(unhooked)} "
                        "(see fallbacks)")
    return {
        "kernel": os.uname().release,
        "bcc": bcc_version,
        "btf": caps["btf"].ok,
        "mounts": mounts,
        "mounted_now": mounted,
        "headers": headers,
        "capabilities": {k: {"ok": c.ok, "detail": c.detail, "reason": c.reason}
                         for k, c in caps.items()},
        "nvml": nvml_status(),
        "plan": {group: {point: str(hook) if hook else None for point, hook in points.items()}
                 for group, points in chosen.items()},
        "notes": notes,
        "problems": problems,
        "ok": not problems,
    }


def _row(ok: bool | None, name: str, text: str) -> str:
    mark = {True: "ok", False: "--", None: "  "}[ok]
    head = f"  {mark}  {name:<{NAME}}"
    return textwrap.fill(text or "-", WIDTH, initial_indent=head, break_on_hyphens=False,
                         subsequent_indent=" " * len(head))


def render_text(r: dict) -> str:
    """The report for a terminal, 80 columns wide."""
    out = [f"sitsprobe doctor: kernel {r['kernel']}, bcc {r['bcc'] or 'missing'}"]
    for fs, point in tracefs.FILESYSTEMS:
        now = " (mounted now)" if any(m.startswith(fs + " ") for m in r["mounted_now"]) else ""
        out.append(_row(r["mounts"][fs], fs, point + now if r["mounts"][fs] else "not mounted"))
    h = r["headers"]
    out.append(_row(h["ok"], "kernel headers", f"{h['kind']}: {h['build'] or 'kheaders'}"
                    if h["ok"] else h["detail"]))
    for extra in (h.get("note"), h.get("linked")):
        if extra and extra != f"using {h.get('build')}":
            out.append(_row(None, "", extra))
    out.append(_row(r["nvml"]["ok"], "nvml", r["nvml"]["detail"]))
    out.append("capabilities")
    out += [_row(c["ok"], k, c["detail"]) for k, c in r["capabilities"].items()]
    for group, points in r["plan"].items():
        out.append(f"probe points ({group})")
        out += [_row(h is not None, p, h or "no working hook") for p, h in points.items()]
    if r.get("tls"):
        out.append("tls (per process)")
        out += [_row(t["ok"], f"pid {pid}", t["detail"]) for pid, t in r["tls"].items()]
    if r["notes"]:
        out.append("fallbacks")
        out += [textwrap.fill(n, WIDTH, initial_indent="  ", subsequent_indent="    ",
                              break_on_hyphens=False) for n in r["notes"]]
    if r["ok"]:
        out.append("result: ok, the agent can run here")
    else:
        out.append("result: the agent cannot run here:")
        out += [textwrap.fill(p, WIDTH, initial_indent="  - ", subsequent_indent="    ",
                              break_on_hyphens=False) for p in r["problems"]]
    return "\n".join(out)


def run(json_out: bool, configured_headers: str | None = None, pids: list[int] = ()) -> int:
    """Print the report; 0 when the agent can run here, else 1."""
    r = report(configured_headers=configured_headers)
    if pids:
        from sitsprobe.probes.tls import tls_status
        r["tls"] = {str(pid): dict(zip(("ok", "detail"), tls_status(pid))) for pid in pids}
    print(json.dumps(r, indent=2) if json_out else render_text(r))
    return 0 if r["ok"] else 1
