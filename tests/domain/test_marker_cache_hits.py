from domain.markers import Marker, check_log, step_key

STEP = 'RUN echo "uv sync layer 0 done"'
VSTEP = 'RUN echo "baked harbor commit: ${HARBOR_COMMIT}"'
M = Marker(name="uv sync layer 0 done", text="uv sync layer 0 done", source="docker/Dockerfile.gpu-rl",
           template="uv sync layer 0 done", must_run=True, step_key=step_key(STEP), line=3)
# A value marker whose value is an ARG of the step's cache key with the planned value (domain/markers.py
# _cache_proves decides that from the Dockerfile).
V = Marker(name="baked harbor commit: abc", text="baked harbor commit: abc", source="docker/Dockerfile.gpu-rl",
           template="baked harbor commit: ${HARBOR_COMMIT}", values={"HARBOR_COMMIT": "abc"}, must_run=True,
           cache_proof=True, step_key=step_key(VSTEP), line=4)


def test_printed_marker_is_found():
    r = check_log([M], "INFO RUN echo \"uv sync layer 0 done\"\nuv sync layer 0 done\n")
    assert r.found == [M.name] and not r.cached and not r.missing


def test_cache_hit_of_the_printing_step_counts_as_cached_not_found():
    log = f'INFO[0003] Using caching version of cmd: {STEP}\n'
    r = check_log([M], log)
    assert r.cached == [M.name] and not r.found and not r.missing
    log = f'\x1b[36mINFO\x1b[0m[0003] Using caching version of cmd: {VSTEP}\n'
    assert check_log([V], log).cached == [V.name]
    # the instruction as kaniko quotes it: continuation lines joined, whitespace as written
    log = 'INFO[0003] Using caching version of cmd: RUN echo    "baked harbor commit: ${HARBOR_COMMIT}"  \n'
    assert check_log([V], log).cached == [V.name]


def test_neither_printed_nor_cached_is_missing():
    r = check_log([M, V], "INFO RUN echo something else\nsomething else\n")
    assert r.missing == [M.name, V.name] and not r.cache_unproven
    # the step's source text in an ordinary (non-cache) line does not count either
    assert check_log([V], f'INFO[0001] {VSTEP}\n').missing == [V.name]


def test_a_cache_hit_of_another_step_holding_the_text_is_not_the_markers():
    """Old code: any cache line holding the echo text counted (`m.template in line`); another step (another
    variant's text, a step that merely mentions it) is not the marker's step."""
    for other in ('RUN echo "uv sync layer 0 done (megatron=0)"', 'RUN if x; then echo "uv sync layer 0 done"; fi',
                  'RUN grep -q "uv sync layer 0 done" /var/log/build.log || true'):
        r = check_log([M], f"INFO[0003] Using caching version of cmd: {other}\n")
        assert r.missing == [M.name] and not r.cached and not r.cache_unproven, other
