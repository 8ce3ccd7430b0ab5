# cmake -P: install the build at BUILD_DIR into WORK_DIR/prefix, then configure, build and run the downstream
# project SOURCE_DIR against it (find_package(deltaproof) through CMAKE_PREFIX_PATH alone).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "failed (${status}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DEXPECT_CUDA=${WITH_CUDA})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/downstream)
run(${WORK_DIR}/prefix/bin/deltaproof --version)
