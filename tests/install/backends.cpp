// install.consumer's second program: the process-group factory, which links
// the Gloo and MPI backends, from an installed lockstep. It prints which
// backends the package has and exits 1 unless they are the ones given
// (`backends gloo=1 mpi=1`): a package that lost a backend would fail to
// link this program, or would say so here.
#include <cstdio>
#include <string>

#include "lockstep/comm/process_group.h"
#include "lockstep/version.h"

// The package's compile definitions stay its own: a consumer asks version().
#ifdef LOCKSTEP_VERSION
#error "an installed lockstep leaks LOCKSTEP_VERSION into its consumers' sources"
#endif

int main(int argc, char** argv) {
  using lockstep::comm::Backend;
  const std::string expected = argc == 3 ? std::string(argv[1]) + " " + argv[2] : "";
  const std::string built = std::string("gloo=") + (lockstep::comm::backend_built(Backend::Gloo) ? "1" : "0") +
                            " mpi=" + (lockstep::comm::backend_built(Backend::Mpi) ? "1" : "0");
  std::printf("lockstep %s; backends in the package: %s (expected: %s)\n", lockstep::version(), built.c_str(),
              expected.c_str());
  return built == expected && lockstep::comm::backend_from_string("gloo") == Backend::Gloo ? 0 : 1;
}
