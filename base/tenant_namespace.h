// Tenants' KV cache namespaces, one rule for every place that applies it:
// where a request's namespace is made (the coordinator's input processor),
// where a tenant's retention budget is counted (Scheduler::Retain) and where
// its chunks are gauged (the coordinator engine).
//  * With tokens, a request from `tenant` lands in "tenant" or
//    "tenant/requested", so tenants share cached prefixes only within
//    themselves whatever namespace or salt they send. Without (tenant ""),
//    the caller's choice stands.
//  * Tenant names hold no '/' (base/grpc_security.h), so a namespace's tenant
//    is what precedes its first '/'.
#ifndef CHUNKATTN_BASE_TENANT_NAMESPACE_H_
#define CHUNKATTN_BASE_TENANT_NAMESPACE_H_

#include <string>
#include <string_view>

namespace chunkattn {

// The cache namespace of a request from `tenant` (Caller::tenant) that asks
// for `requested` (cache_namespace, cache_salt).
inline std::string CacheNamespace(std::string_view tenant, std::string_view requested) {
  if (tenant.empty()) return std::string(requested);
  if (requested.empty()) return std::string(tenant);
  std::string ns(tenant);
  ns += '/';
  ns += requested;
  return ns;
}

// Whether `ns` is one CacheNamespace gives `tenant` ("": every one). A tenant
// whose name starts another's ("acme", "acme2") owns none of its namespaces.
inline bool TenantOwnsNamespace(std::string_view tenant, std::string_view ns) {
  if (tenant.empty() || ns == tenant) return true;
  return ns.size() > tenant.size() && ns.compare(0, tenant.size(), tenant) == 0 && ns[tenant.size()] == '/';
}

// The tenant whose namespace `ns` is (with tokens; without, "" owns them all).
inline std::string_view NamespaceTenant(std::string_view ns) { return ns.substr(0, ns.find('/')); }

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_TENANT_NAMESPACE_H_
