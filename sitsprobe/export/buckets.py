"""The bounds of the histograms the agent exports, in seconds (batch sizes
in requests): its own, and in-kernel counting's (bpf/net.c's bins are cut
at DURATION_BUCKETS and SEGMENT_BUCKETS), in a module of their own so that
what compiles net.c imports no exporter."""

# OpenTelemetry's advice for http.server.request.duration, in seconds
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# The GenAI conventions' advice for gen_ai.server.time_to_first_token,
# time_per_output_token and request.duration starts at 1 ms, 10 ms and 10 ms:
# blind below that, where a small model on a CPU (the reference engine: TPOT
# 0.6 ms) or a fast GPU decode step lives. Each keeps the advice and adds
# bounds below it, so both a sub-millisecond engine and a GPU engine's tens
# of milliseconds are resolved.
TTFT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
                0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05,
                0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GENAI_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                          5.12, 10.24, 20.48, 40.96, 81.92)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The GenAI conventions' advice for gen_ai.client.token.usage, in tokens
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
# a segment may be microseconds (a send) or the whole of a long stream
SEGMENT_BUCKETS = (0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
