"""PynvmlBackend through the real pynvml, over a stand-in libnvidia-ml.so.1.

No NVIDIA driver here, so a small C library with NVML's ABI for the calls the
backend makes answers instead: it checks the structs, constants and cursors
pynvml passes, and the sampler's reading of what comes back."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_NVML = r'''
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7,
       GPU_IS_LOST = 15, ARGUMENT_VERSION_MISMATCH = 25 };
static int devs[3];
static unsigned long long base_us, last_seen[3], lost[3];
static int idx(void *h) { return (int *)h - devs; }
static unsigned long long now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, 0);
    return (unsigned long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* test controls, called through ctypes */
unsigned long long fake_last_seen(int gpu) { return last_seen[gpu]; }
void fake_lose(int gpu) { lost[gpu] = 1; }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { base_us = now_us() - 1000000; return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { return "fake nvml error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 3; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h)
{
    if (i > 2) return INVALID_ARGUMENT;
    *h = &devs[i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *buf, unsigned int len)
{ snprintf(buf, len, "GPU-fake-%d", idx(h)); return OK; }
nvmlReturn_t nvmlDeviceGetName(void *h, char *buf, unsigned int len)
{ snprintf(buf, len, "Fake H200"); return OK; }

typedef struct { unsigned int version, isSupportedDevice; } gpm_support_t;
nvmlReturn_t nvmlGpmQueryDeviceSupport(void *h, gpm_support_t *s)
{
    if (s->version != 1) return ARGUMENT_VERSION_MISMATCH;
    s->isSupportedDevice = idx(h) == 0;
    return OK;
}
typedef struct { int gpu; unsigned long long seq; } gpm_sample_t;
static unsigned long long seq;
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **s) { *s = calloc(1, sizeof **s); return OK; }
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *s) { free(s); return OK; }
nvmlReturn_t nvmlGpmSampleGet(void *h, gpm_sample_t *s) { s->gpu = idx(h); s->seq = ++seq; return OK; }
typedef struct { char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; metric_info_t info; } metric_t;
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample_t *sample1, *sample2;
    metric_t metrics[477];
} metrics_get_t;
nvmlReturn_t nvmlGpmMetricsGet(metrics_get_t *m)
{
    if (m->version != 1) return ARGUMENT_VERSION_MISMATCH;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        metric_t *x = &m->metrics[i];
        x->nvmlReturn = OK;
        if (x->metricId == 2)       /* SM_UTIL */
            x->value = 42.5;
        else if (x->metricId == 3)  /* SM_OCCUPANCY: how far apart the two samples are */
            x->value = (double)(m->sample2->seq - m->sample1->seq);
        else
            x->nvmlReturn = NOT_SUPPORTED;
    }
    return OK;
}

typedef union { double d; unsigned int ui; unsigned long ul; unsigned long long ull;
                long long sll; int si; unsigned short us; } value_t;
typedef struct { unsigned long long timeStamp; value_t sampleValue; } sample_t;
/* GPU 1 takes a 64 % sample every 100 ms from base_us; others have none */
nvmlReturn_t nvmlDeviceGetSamples(void *h, int type, unsigned long long last, int *vtype,
                                  unsigned int *count, sample_t *out)
{
    int g = idx(h);
    if (g != 1) return NOT_SUPPORTED;
    if (type != 1) return INVALID_ARGUMENT;  /* NVML_GPU_UTILIZATION_SAMPLES */
    last_seen[g] = last;
    unsigned long long now = now_us();
    unsigned int n = 0, cap = out ? *count : 0;
    for (unsigned long long ts = base_us; ts <= now; ts += 100000)
        if (ts > last) {
            if (out && n < cap) {
                out[n].timeStamp = ts;
                out[n].sampleValue.ui = 64;
            }
            n++;
        }
    *vtype = 1;  /* unsigned int */
    *count = out ? (n < cap ? n : cap) : n;
    return n || !out ? OK : NOT_FOUND;
}

typedef struct { unsigned int gpu, memory; } util_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, util_t *u)
{
    if (lost[idx(h)]) return GPU_IS_LOST;
    u->gpu = 30 + idx(h);
    u->memory = 5;
    return OK;
}
typedef struct { unsigned long long total, free, used; } memory_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, memory_t *m)
{ m->total = 141ULL << 30; m->used = 3ULL << 30; m->free = m->total - m->used; return OK; }
nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) { *mw = 250500; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned int *mhz)
{ if (type != 1) return INVALID_ARGUMENT; *mhz = 1980; return OK; }  /* NVML_CLOCK_SM */
nvmlReturn_t nvmlDeviceGetPcieThroughput(void *h, int counter, unsigned int *kb)
{ *kb = counter == 0 ? 111 : 222; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r)
{ *r = 0x1 | 0x20; return OK; }
typedef struct { unsigned int pid; unsigned long long timeStamp;
                 unsigned int smUtil, memUtil, encUtil, decUtil; } proc_t;
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *h, proc_t *out, unsigned int *count,
                                             unsigned long long last)
{
    proc_t all[2] = {{4242, base_us + 500000, 77, 3, 0, 0}, {4243, base_us + 400000, 5, 0, 0, 0}};
    unsigned int n = 0;
    if (idx(h) != 0) return NOT_FOUND;
    for (int i = 0; i < 2; i++)
        if (all[i].timeStamp > last) {
            if (out && n < *count) out[n] = all[i];
            n++;
        }
    if (!n) return NOT_FOUND;
    if (!out || *count < n) { *count = n; return INSUFFICIENT_SIZE; }
    *count = n;
    return OK;
}
typedef struct { unsigned int pid; unsigned long long usedGpuMemory;
                 unsigned int gpuInstanceId, computeInstanceId; } proc_info_t;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, proc_info_t *out)
{
    if (idx(h) != 1) { *count = 0; return OK; }
    if (!out || *count < 2) { *count = 2; return INSUFFICIENT_SIZE; }
    out[0] = (proc_info_t){5150, 1ULL << 30, 0, 0};
    out[1] = (proc_info_t){5151, 2ULL << 30, 0, 0};
    *count = 2;
    return OK;
}
'''

DRIVER = r'''
import ctypes, dataclasses, json, time
from sitsprobe.gpu.nvml import NvmlSampler, available

fake = ctypes.CDLL("libnvidia-ml.so.1")
fake.fake_last_seen.restype = ctypes.c_ulonglong
out = {"available": available()}
s = NvmlSampler(interval_s=0.2)
out["gpus"] = [[g.index, g.uuid, g.name] for g in s.open()]
out["signals"] = s.signals()
out["primed_cursor"] = fake.fake_last_seen(1)
first = s.tick()
time.sleep(0.35)
second = s.tick()
out["cursor_after"] = fake.fake_last_seen(1)
fake.fake_lose(2)
third = s.tick()
out["ticks"] = [[dataclasses.asdict(x) for x in t] for t in (first, second, third)]
out["errors"] = [[g, e, n] for (g, e), n in s.errors().items()]
s.close()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("pynvml")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the stand-in libnvidia-ml.so.1")
    d = tmp_path_factory.mktemp("fake_nvml")
    (d / "fake_nvml.c").write_text(FAKE_NVML)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(d / "libnvidia-ml.so.1"),
                    str(d / "fake_nvml.c")], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(d), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_available_and_devices(run):
    assert run["available"] == [True, "3 GPU(s): Fake H200, Fake H200, Fake H200"]
    assert run["gpus"] == [[0, "GPU-fake-0", "Fake H200"], [1, "GPU-fake-1", "Fake H200"],
                           [2, "GPU-fake-2", "Fake H200"]]
    assert run["signals"] == {"0": "gpm_sm_util", "1": "samples", "2": "utilization_rates"}


def test_gpm_through_pynvml(run):
    first, second = run["ticks"][0][0], run["ticks"][1][0]
    assert first["busy_percent"] is None
    assert second["busy_percent"] == 42.5
    assert second["sm_occupancy_percent"] == 1.0  # consecutive samples: one apart
    assert 0.3e9 < second["window_ns"] < 2e9


def test_samples_cursor_through_pynvml(run):
    assert run["primed_cursor"] == 0
    assert run["cursor_after"] > 0
    second = run["ticks"][1][1]
    assert second["signal"] == "samples" and second["busy_percent"] == 64.0
    assert 200_000_000 <= second["window_ns"] <= 600_000_000  # ~0.35 s of 100 ms samples


def test_every_other_reading_through_pynvml(run):
    x = run["ticks"][0][0]
    assert x["util_gpu_percent"] == 30.0 and x["util_memory_percent"] == 5.0
    assert (x["memory_used_bytes"], x["memory_total_bytes"]) == (3 << 30, 141 << 30)
    assert x["power_watts"] == 250.5 and x["sm_clock_mhz"] == 1980
    assert (x["pcie_tx_bytes_per_s"], x["pcie_rx_bytes_per_s"]) == (111 * 1024, 222 * 1024)
    assert x["throttle_reasons"] == ["gpu_idle", "sw_thermal_slowdown"]
    assert [(p["pid"], p["sm_percent"], p["memory_percent"]) for p in x["processes"]] == [
        (4242, 77.0, 3.0), (4243, 5.0, 0.0)]
    assert run["ticks"][0][2]["busy_percent"] == 32.0  # the rates, on the third GPU
    assert [x["compute_pids"] for x in run["ticks"][0]] == [[], [5150, 5151], []]


def test_lost_gpu_through_pynvml(run):
    assert [x["gpu"] for x in run["ticks"][2]] == [0, 1]
    assert run["errors"] == [[2, "gpu_is_lost", 1]]
