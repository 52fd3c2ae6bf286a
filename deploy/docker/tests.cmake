# Tests of the container images (included from deploy/CMakeLists.txt).
#   deploy_image_lint     static checks of the Dockerfiles and scripts; always runs, no engine.
#   deploy_image_cluster  the containerised cluster test (deploy/scripts/image-test.sh) on the
#                         pdserve:cpu image. It skips (exit 77) when no Docker engine answers or the
#                         image is absent: under ctest it never starts a dockerd nor builds the image
#                         unless PDSERVE_IMAGE_TESTS=1 is set (then it may take a cold image build,
#                         ~15-30 min on 2 cores; hence the timeout).
set(pdserve_image_scripts ${CMAKE_CURRENT_LIST_DIR}/../scripts)

add_test(NAME deploy_image_lint COMMAND bash ${pdserve_image_scripts}/image-lint.sh)
set_tests_properties(deploy_image_lint PROPERTIES LABELS "deploy;image;unit" TIMEOUT 60)

add_test(NAME deploy_image_cluster COMMAND bash ${pdserve_image_scripts}/image-test.sh)
set_tests_properties(deploy_image_cluster PROPERTIES
  LABELS "deploy;image;integration"
  SKIP_RETURN_CODE 77
  TIMEOUT 3600
  # One image test at a time (they share the engine and, with PDSERVE_IMAGE_TESTS=1, a build).
  RESOURCE_LOCK pdserve_docker
  ENVIRONMENT "PDSERVE_SOURCE_DIR=${CMAKE_SOURCE_DIR};BUILD_DIR=${CMAKE_BINARY_DIR};PDSERVE_IMAGE_TEST_FROM_CTEST=1")
