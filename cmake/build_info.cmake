# Build facts for fo_jax.build_info() (fo_jax/_version.py), installed as fo_jax/_build_info.py:
# the version scikit-build-core read from fo_jax/_version.py, the source's git commit (+dirty with
# uncommitted changes; FO_JAX_COMMIT overrides it for trees copied without their .git) and whether
# this build has the CUDA module. Included by CMakeLists.txt once FO_JAX_CUDA is decided.
set(_fo_jax_commit "$ENV{FO_JAX_COMMIT}")
if(NOT _fo_jax_commit)
  execute_process(COMMAND git -C "${CMAKE_CURRENT_SOURCE_DIR}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE _fo_jax_commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0)
    execute_process(COMMAND git -C "${CMAKE_CURRENT_SOURCE_DIR}" status --porcelain
                            --untracked-files=no
                    OUTPUT_VARIABLE _dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_dirty)
      string(APPEND _fo_jax_commit "+dirty")
    endif()
  else()
    set(_fo_jax_commit "unknown")
  endif()
endif()
if(FO_JAX_CUDA)
  set(_fo_jax_cuda_py True)
else()
  set(_fo_jax_cuda_py False)
endif()
file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/_build_info.py" CONTENT
"# Written by cmake/build_info.cmake when this fo_jax was built; read by fo_jax.build_info().
VERSION = \"${SKBUILD_PROJECT_VERSION_FULL}\"
COMMIT = \"${_fo_jax_commit}\"
CUDA = ${_fo_jax_cuda_py}
")
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/_build_info.py" DESTINATION fo_jax)
message(STATUS
        "fo_jax: ${SKBUILD_PROJECT_VERSION_FULL}, commit ${_fo_jax_commit}, CUDA module ${FO_JAX_CUDA}")
