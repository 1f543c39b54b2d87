from domain.markers import Marker, check_log

M = Marker(name="uv sync layer 0 done", text="uv sync layer 0 done", source="docker/Dockerfile.gpu-rl",
           template="uv sync layer 0 done")
V = Marker(name="baked harbor commit: abc", text="baked harbor commit: abc", source="docker/Dockerfile.gpu-rl",
           template="baked harbor commit: ${HARBOR_COMMIT}")


def test_printed_marker_is_found():
    r = check_log([M], "INFO RUN echo \"uv sync layer 0 done\"\nuv sync layer 0 done\n")
    assert r.found == [M.name] and not r.cached and not r.missing


def test_cache_hit_of_the_printing_step_counts_as_cached_not_found():
    log = 'INFO[0003] Using caching version of cmd: RUN echo "uv sync layer 0 done"\n'
    r = check_log([M], log)
    assert r.cached == [M.name] and not r.found and not r.missing
    log = 'INFO[0003] Using caching version of cmd: RUN echo "baked harbor commit: ${HARBOR_COMMIT}"\n'
    assert check_log([V], log).cached == [V.name]


def test_neither_printed_nor_cached_is_missing():
    r = check_log([M, V], "INFO RUN echo something else\nsomething else\n")
    assert r.missing == [M.name, V.name]
    # the step's source text in an ordinary (non-cache) line does not count either
    assert check_log([V], 'INFO[0001] RUN echo "baked harbor commit: ${HARBOR_COMMIT}"\n').missing == [V.name]
