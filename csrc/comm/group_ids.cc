#include "comm/group_ids.h"

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace fo_jax {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::string> ids;  // token -> unique id
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: calls may run at exit
  return *registry;
}

}  // namespace

void RegisterGroupUniqueId(const std::string& token, const std::string& unique_id) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ids[token] = unique_id;
}

bool FindGroupUniqueId(const uint8_t* token, char* unique_id) {
  Registry& r = GetRegistry();
  const std::string key(reinterpret_cast<const char*>(token), kGroupTokenBytes);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ids.find(key);
  if (it == r.ids.end()) return false;
  std::memcpy(unique_id, it->second.data(), kGroupUniqueIdBytes);
  return true;
}

}  // namespace fo_jax
