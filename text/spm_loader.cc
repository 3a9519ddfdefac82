// Loads the SentencePiece module (see spm_bridge.h for why it is a module).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "text/spm_bridge.h"

namespace chunkattn::spm_bridge {
namespace {

// The sanitizers' runtimes refuse RTLD_DEEPBIND (it would bypass their
// interceptors), so their builds load the module into the global lookup
// order; their processes with libprotobuf then must not load a tokenizer
// (scripts/sanitize.sh runs those without one).
#ifdef CHUNKATTN_SANITIZER_BUILD
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL;
#else
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif

using LoadFn = Model* (*)(const std::string*, Error*);

constexpr int kFailedPrecondition = 9;

// Resolved once per process; the module stays loaded.
LoadFn Resolve(std::string* why) {
  static std::once_flag once;
  static LoadFn fn = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("CHUNKATTN_SPM_MODULE"); env != nullptr && *env != '\0') {
      candidates.push_back(env);
    }
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      exe[n] = '\0';
      std::string dir(exe);
      dir = dir.substr(0, dir.rfind('/'));
      candidates.push_back(dir + "/../lib/libchunkattn_spm.so");
      candidates.push_back(dir + "/libchunkattn_spm.so");
    }
    candidates.push_back(CHUNKATTN_SPM_MODULE_PATH);
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), kDlopenFlags);
      if (handle == nullptr) {
        failure += std::string(failure.empty() ? "" : "; ") + dlerror();
        continue;
      }
      fn = reinterpret_cast<LoadFn>(dlsym(handle, "chunkattn_spm_bridge_load"));
      if (fn != nullptr) return;
      failure += "; " + path + " has no chunkattn_spm_bridge_load";
    }
  });
  if (fn == nullptr) *why = "cannot load the SentencePiece module: " + failure;
  return fn;
}

}  // namespace

std::unique_ptr<Model> Model::Load(const std::string& path, Error* error) {
  std::string why;
  LoadFn load = Resolve(&why);
  if (load == nullptr) {
    *error = Error{kFailedPrecondition, why};
    return nullptr;
  }
  *error = Error{};
  return std::unique_ptr<Model>(load(&path, error));
}

}  // namespace chunkattn::spm_bridge
