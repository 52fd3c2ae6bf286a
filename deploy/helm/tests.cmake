# The Helm chart's offline tests (ctest -L deploy). Included by deploy/CMakeLists.txt when
# PDSERVE_BUILD_TESTS is on. They need node and npm; the npm packages pinned in deploy/package.json
# (Helm 3, Helm 4, kubernetes-models, typescript) are installed once, outside the build and the
# checkout, by deploy/scripts/chart-tools.sh: the deploy_chart_tools test, a fixture the others need.
find_program(PDSERVE_NODE_EXECUTABLE node)
find_program(PDSERVE_NPM_EXECUTABLE npm)
find_program(PDSERVE_BASH_EXECUTABLE bash)
if(NOT PDSERVE_NODE_EXECUTABLE OR NOT PDSERVE_NPM_EXECUTABLE OR NOT PDSERVE_BASH_EXECUTABLE)
  message(STATUS "deploy: node/npm/bash not found, the Helm chart tests are not registered")
  return()
endif()

set(_pdserve_deploy_scripts ${CMAKE_CURRENT_LIST_DIR}/../scripts)

add_test(NAME deploy_chart_tools
         COMMAND ${PDSERVE_BASH_EXECUTABLE} ${_pdserve_deploy_scripts}/chart-tools.sh)
# A cold npm cache downloads ~180 MB; warm, this is a file check.
set_tests_properties(deploy_chart_tools PROPERTIES
  LABELS "deploy;unit" TIMEOUT 900 FIXTURES_SETUP pdserve_chart_tools)

foreach(_suite lint golden schema invariants negative aggregated)
  add_test(NAME deploy_chart_${_suite}
           COMMAND ${PDSERVE_BASH_EXECUTABLE} ${_pdserve_deploy_scripts}/chart-test.sh ${_suite})
  set_tests_properties(deploy_chart_${_suite} PROPERTIES
    LABELS "deploy;unit" TIMEOUT 300 FIXTURES_REQUIRED pdserve_chart_tools)
endforeach()

# The values.yaml `pdserve tune` writes, rendered by the chart (tune.test.mjs): the plans come from
# tune_deploy_values_emit (tests/tune), so the test checks what tune/deploy_values.cc really emits.
if(TARGET tune_deploy_values_emit)
  add_test(NAME deploy_chart_tune
           COMMAND ${PDSERVE_BASH_EXECUTABLE} ${_pdserve_deploy_scripts}/chart-test.sh tune)
  set_tests_properties(deploy_chart_tune PROPERTIES
    LABELS "deploy;tune;unit" TIMEOUT 300 FIXTURES_REQUIRED pdserve_chart_tools
    ENVIRONMENT "PDSERVE_TUNE_VALUES_EMIT=$<TARGET_FILE:tune_deploy_values_emit>")
endif()
