# aotc.cmake -- compile ONNX models and TensorFlow graphs to C libraries with
# aotc as part of a CMake build.
#
# Usage (after include(path/to/cmake/aotc.cmake) or add_subdirectory of the
# aotc repository):
#
#   aotc_add_model(<target> MODEL <file.onnx | file.pb | file.pbtxt | saved_model_dir>
#                  [NAME <c-name>] [CONFIG <file.pbtxt>] [TARGET_CPU <cpu>]
#                  [CPP_CLASS <ns::Name>] [SIGNATURE <name>] [TAG_SET <tags>]
#                  [EXTRA_ARGS <arg>...])
#
# runs "aotc compile" at build time into ${CMAKE_CURRENT_BINARY_DIR}/<target>_aotc/
# and defines <target>, an IMPORTED STATIC library carrying the generated
# header's directory, libm and (where found) the threads library in its usage
# requirements:
#
#   aotc_add_model(mlp MODEL ${CMAKE_CURRENT_SOURCE_DIR}/mlp.onnx)
#   add_executable(app app.c)          # app.c does #include "mlp.h"
#   target_link_libraries(app PRIVATE mlp)
#
# NAME defaults to <target> made into a C identifier; it sets the header
# (<name>.h), the library (lib<name>.a) and the prefix of the C functions.
# Relative MODEL/CONFIG paths are taken relative to the current source dir.
#
# In place of TensorFlow's tf_library: MODEL may be a frozen GraphDef (.pb,
# .pbtxt) or a SavedModel directory (SIGNATURE and TAG_SET choose the
# function, as aotc compile's --signature and --tag-set do), CONFIG the same
# tf2xla.Config file, and CPP_CLASS also generates <name>.hpp with the C++
# class tfcompile's header had (see docs/tfcompile.md):
#
#   aotc_add_model(mlp MODEL mlp.pb CONFIG mlp.config.pbtxt CPP_CLASS example::Mlp)
#   add_executable(app main.cc)        # main.cc does #include "mlp.hpp"
#   target_link_libraries(app PRIVATE mlp)
#
# The model is recompiled when the model or config changes; with generators
# that support depfiles (Ninja; Makefiles with CMake >= 3.20) also when aotc
# itself changes.
#
# Cache variable AOTC_EXECUTABLE: the aotc command. Found with find_program;
# set it to override (it may be a list, e.g. "/usr/bin/python3;-m;aotc").
#
# After the call, these variables are set in the caller's scope:
#   <target>_AOTC_INCLUDE_DIR, <target>_AOTC_HEADER, <target>_AOTC_LIBRARY,
#   <target>_AOTC_SHARED_LIBRARY (aotc also builds lib<name>.so),
#   <target>_AOTC_CPP_HEADER (<name>.hpp; with CPP_CLASS only)

include_guard(GLOBAL)

# Functions record the policy settings in effect where they are defined;
# include() gives this file its own policy scope. CMP0116 NEW: Ninja
# depfile paths are taken relative to the build dir (aotc writes absolute
# paths anyway), without a policy warning.
if(POLICY CMP0116)
  cmake_policy(SET CMP0116 NEW)
endif()

find_program(AOTC_EXECUTABLE NAMES aotc DOC "aotc ahead-of-time compiler command")

function(aotc_add_model target)
  cmake_parse_arguments(PARSE_ARGV 1 _aotc "" "MODEL;NAME;CONFIG;TARGET_CPU;CPP_CLASS;SIGNATURE;TAG_SET"
                        "EXTRA_ARGS")
  if(_aotc_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "aotc_add_model(${target}): unknown arguments: ${_aotc_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT _aotc_MODEL)
    message(FATAL_ERROR "aotc_add_model(${target}): MODEL <file.onnx|file.pb|saved_model_dir> is required")
  endif()
  if(TARGET ${target})
    message(FATAL_ERROR "aotc_add_model(${target}): a target named '${target}' already exists")
  endif()
  if(NOT AOTC_EXECUTABLE)
    message(FATAL_ERROR
      "aotc_add_model(${target}): the aotc executable was not found; install aotc "
      "(pip install aotc) or set -DAOTC_EXECUTABLE=/path/to/aotc")
  endif()

  if(_aotc_NAME)
    set(name "${_aotc_NAME}")
    string(MAKE_C_IDENTIFIER "${name}" _c_name)
    if(NOT _c_name STREQUAL name)
      message(FATAL_ERROR "aotc_add_model(${target}): NAME '${name}' is not a C identifier")
    endif()
  else()
    string(MAKE_C_IDENTIFIER "${target}" name)
  endif()

  get_filename_component(model "${_aotc_MODEL}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_aotc")
  set(header "${out_dir}/${name}.h")
  set(library "${out_dir}/lib${name}.a")
  set(shared_library "${out_dir}/lib${name}.so")
  set(depfile "${out_dir}/${name}.d")

  set(args compile "${model}" -o "${out_dir}" -n "${name}")
  set(outputs "${library}" "${header}" "${shared_library}")
  if(IS_DIRECTORY "${model}")
    # A SavedModel: its graph and the variables checkpoint. A DEPENDS on the
    # directory itself would not see a file inside it change.
    file(GLOB variables CONFIGURE_DEPENDS "${model}/variables/*")
    set(deps "${model}/saved_model.pb" ${variables})
  else()
    set(deps "${model}")
  endif()
  if(_aotc_CONFIG)
    get_filename_component(config "${_aotc_CONFIG}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND args -c "${config}")
    list(APPEND deps "${config}")
  endif()
  if(_aotc_TARGET_CPU)
    list(APPEND args --target-cpu "${_aotc_TARGET_CPU}")
  endif()
  if(_aotc_SIGNATURE)
    list(APPEND args --signature "${_aotc_SIGNATURE}")
  endif()
  if(_aotc_TAG_SET)
    list(APPEND args --tag-set "${_aotc_TAG_SET}")
  endif()
  set(cpp_header "")
  if(_aotc_CPP_CLASS)
    set(cpp_header "${out_dir}/${name}.hpp")
    list(APPEND args --cpp-class "${_aotc_CPP_CLASS}")
    list(APPEND outputs "${cpp_header}")
  endif()
  list(APPEND args ${_aotc_EXTRA_ARGS})

  # DEPFILE: Ninja has supported it for long; Makefile generators since 3.20.
  set(depfile_args)
  if(CMAKE_GENERATOR MATCHES "Ninja"
     OR (CMAKE_GENERATOR MATCHES "Makefiles" AND NOT CMAKE_VERSION VERSION_LESS 3.20))
    list(APPEND args --depfile "${depfile}")
    set(depfile_args DEPFILE "${depfile}")
  endif()

  # The imported target's include directory must exist at generate time.
  file(MAKE_DIRECTORY "${out_dir}")

  add_custom_command(
    # aotc also writes lib<name>.so (and <name>.hpp), and its depfile names
    # them as targets: declare them, or Ninja rejects the depfile.
    OUTPUT ${outputs}
    COMMAND ${AOTC_EXECUTABLE} ${args}
    # aotc does not rewrite outputs whose contents are unchanged; touch them
    # so that they are newer than the inputs and the step is not rerun.
    COMMAND "${CMAKE_COMMAND}" -E touch ${outputs}
    DEPENDS ${deps}
    ${depfile_args}
    WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}"
    COMMENT "aotc: compiling ${_aotc_MODEL} -> lib${name}.a"
    VERBATIM)
  add_custom_target(${target}_aotc_gen DEPENDS ${outputs})

  # The generated thread pool (<name>_pool_create) uses pthreads; the rest of the library does not.
  if(NOT TARGET Threads::Threads AND (CMAKE_C_COMPILER_LOADED OR CMAKE_CXX_COMPILER_LOADED))
    find_package(Threads QUIET)
  endif()
  add_library(${target} STATIC IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES
    IMPORTED_LOCATION "${library}"
    IMPORTED_LINK_INTERFACE_LANGUAGES "C"
    INTERFACE_INCLUDE_DIRECTORIES "${out_dir}"
    INTERFACE_LINK_LIBRARIES "m;$<$<TARGET_EXISTS:Threads::Threads>:Threads::Threads>")
  # Anything linking ${target} waits for the aotc run (followed transitively
  # since an imported target does not build by itself).
  add_dependencies(${target} ${target}_aotc_gen)

  set(${target}_AOTC_INCLUDE_DIR "${out_dir}" PARENT_SCOPE)
  set(${target}_AOTC_HEADER "${header}" PARENT_SCOPE)
  set(${target}_AOTC_LIBRARY "${library}" PARENT_SCOPE)
  set(${target}_AOTC_SHARED_LIBRARY "${shared_library}" PARENT_SCOPE)
  set(${target}_AOTC_CPP_HEADER "${cpp_header}" PARENT_SCOPE)
endfunction()
