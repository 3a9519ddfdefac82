// Bearer tokens, roles and tenant namespaces (base/grpc_security.h): the
// rules every front applies, checked here against brute-force statements of
// them, so that no front's test is the only guard.
#include "base/grpc_security.h"
#include "base/tenant_namespace.h"

#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

// A token file with `text`, removed when the test ends.
class TokenFile {
 public:
  explicit TokenFile(const std::string& text) {
    char name[] = "/tmp/chunkattn-tokens-XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
  }
  ~TokenFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TokenAuth AuthOf(const std::string& text) {
  TokenFile file(text);
  absl::StatusOr<TokenAuth> auth = TokenAuth::FromFile(file.path());
  EXPECT_TRUE(auth.ok()) << auth.status();
  return auth.ok() ? *std::move(auth) : TokenAuth();
}

TEST(TokenFileTest, TenantsRolesAndErrors) {
  TokenFile file("# comment\nt1\nt2 acme\n  t3\tacme2  \nr1 role:router\no1 role:operator\n\n");
  absl::StatusOr<std::vector<TokenEntry>> e = ReadTokenEntries(file.path(), "--auth_token_file");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 5u);
  EXPECT_EQ((*e)[0].token, "t1");
  EXPECT_EQ((*e)[0].tenant, "");
  EXPECT_EQ((*e)[1].tenant, "acme");
  EXPECT_EQ((*e)[2].token, "t3");
  EXPECT_EQ((*e)[2].tenant, "acme2");
  EXPECT_EQ((*e)[3].role, Role::kRouter);
  EXPECT_EQ((*e)[3].tenant, "");
  EXPECT_EQ((*e)[4].role, Role::kOperator);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*e)[i].role, Role::kTenant);

  const std::pair<const char*, const char*> bad[] = {
      {"a b c\n", "'TOKEN' or 'TOKEN TENANT'"},
      {"a role:admin\n", "role:router or role:operator"},
      {"a role:\n", "role:router or role:operator"},
      {"a ac/me\n", "a tenant is 1 to 64"},
      {"a t:acme\n", "a tenant is 1 to 64"},
      {"# only a comment\n", "has no token"},
      {"a 0123456789012345678901234567890123456789012345678901234567890123456789\n", "a tenant is 1 to 64"},
  };
  for (const auto& [text, message] : bad) {
    TokenFile f(text);
    absl::StatusOr<TokenAuth> auth = TokenAuth::FromFile(f.path(), "--auth_token_file");
    EXPECT_TRUE(absl::IsInvalidArgument(auth.status())) << text << ": " << auth.status();
    EXPECT_TRUE(absl::StrContains(auth.status().message(), message)) << auth.status();
    EXPECT_TRUE(absl::StrContains(auth.status().message(), "--auth_token_file")) << auth.status();
  }
  // A token that merely starts like a role is a token.
  TokenFile lone("role:router\n");
  absl::StatusOr<std::vector<TokenEntry>> l = ReadTokenEntries(lone.path(), "--f");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)[0].token, "role:router");
  EXPECT_EQ((*l)[0].role, Role::kTenant);
  // A shared-secret file takes no tenants and no roles.
  TokenFile worker("s1 role:router\n");
  EXPECT_TRUE(absl::IsInvalidArgument(ReadTokenFile(worker.path(), "--worker_token_file").status()));
}

TEST(TokenAuthTest, EachUnboundTokenIsItsOwnTenant) {
  const TokenAuth auth = AuthOf("u1\nu2\nb1 acme\nb2 acme\nr1 role:router\n");
  auto tenant = [&](const char* token) {
    absl::StatusOr<Caller> c = auth.Authenticate(absl::StrCat("Bearer ", token));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->tenant : std::string("?");
  };
  // Two unbound tokens: two tenants (no shared cache, no Abort of each other).
  EXPECT_NE(tenant("u1"), tenant("u2"));
  EXPECT_NE(CacheNamespace(tenant("u1"), "x"), CacheNamespace(tenant("u2"), "x"));
  EXPECT_FALSE(TenantOwnsNamespace(tenant("u1"), CacheNamespace(tenant("u2"), "")));
  // Two tokens bound to one tenant: one tenant.
  EXPECT_EQ(tenant("b1"), tenant("b2"));
  EXPECT_NE(tenant("b1"), tenant("u1"));
  for (const char* missing : {"", "Bearer", "Bearer ", "Basic u1", "Bearer u3", "Bearer u1x", "Bearer u"}) {
    EXPECT_TRUE(absl::IsUnauthenticated(auth.Authenticate(missing).status())) << missing;
  }
}

TEST(TokenAuthTest, PermissionsByRole) {
  const TokenAuth auth = AuthOf("t1 acme\nu1\nr1 role:router\no1 role:operator\n");
  const Permission all[] = {Permission::kModelInfo, Permission::kGenerate, Permission::kPoolStats,
                            Permission::kKvEvents};
  // token -> allowed, in `all`'s order.
  const std::pair<const char*, std::vector<bool>> want[] = {
      {"t1", {true, true, false, false}},
      {"u1", {true, true, false, false}},
      {"r1", {true, false, true, true}},
      {"o1", {true, false, true, false}},
  };
  for (const auto& [token, allowed] : want) {
    for (size_t i = 0; i < 4; ++i) {
      absl::StatusOr<Caller> c = auth.Authorize(absl::StrCat("Bearer ", token), all[i]);
      EXPECT_EQ(c.ok(), allowed[i]) << token << " permission " << i << ": " << c.status();
      if (!c.ok()) EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
    }
  }
  EXPECT_TRUE(absl::IsUnauthenticated(auth.Authorize("Bearer nope", Permission::kModelInfo).status()));
  // Authentication off: one trust domain, every call passes.
  const TokenAuth off;
  for (Permission p : all) {
    absl::StatusOr<Caller> c = off.Authorize("", p);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->tenant, "");
  }
}

// The namespace rules against their statement: a tenant's namespaces are
// exactly its own name and names under "<tenant>/"; a tenant whose name
// starts another's owns none of them.
TEST(TenantNamespaceTest, PrefixTenantsNeverMatch) {
  const std::vector<std::string> tenants = {"t:acme", "t:acme2", "t:acm", "t:acme.x", "k:1", "k:11", "k:2"};
  const std::vector<std::string> salts = {"", "s", "s/t", "acme", "2", "/", "a b"};
  for (const std::string& owner : tenants) {
    for (const std::string& salt : salts) {
      const std::string ns = CacheNamespace(owner, salt);
      for (const std::string& t : tenants) {
        EXPECT_EQ(TenantOwnsNamespace(t, ns), t == owner) << t << " vs " << ns;
      }
      EXPECT_TRUE(TenantOwnsNamespace("", ns));  // authentication off
    }
  }
  // Random names, including ones built to collide textually.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(1, 4), ch(0, 3);
  const char alphabet[] = {'a', 'b', '/', '2'};
  for (int i = 0; i < 5000; ++i) {
    auto name = [&] {
      std::string s;
      for (int k = len(rng); k > 0; --k) s += alphabet[ch(rng)];
      return s;
    };
    const std::string a = "t:" + name(), b = "t:" + name(), salt = ch(rng) == 0 ? "" : name();
    const std::string ns = CacheNamespace(a, salt);
    // The statement, brute force: ns is b, or begins with b + "/".
    const bool owned = ns == b || (ns.size() > b.size() && ns.compare(0, b.size() + 1, b + "/") == 0);
    EXPECT_EQ(TenantOwnsNamespace(b, ns), owned) << a << " " << b << " " << salt;
    EXPECT_TRUE(TenantOwnsNamespace(a, ns));
  }
}

TEST(TenantNamespaceTest, CacheSaltIsScopedToTheTenant) {
  // Without authentication the salt is the namespace; with it, always under
  // the tenant, whatever the salt says (another tenant's name included).
  EXPECT_EQ(CacheNamespace("", "team-a"), "team-a");
  EXPECT_EQ(CacheNamespace("", ""), "");
  EXPECT_EQ(CacheNamespace("t:acme", ""), "t:acme");
  EXPECT_EQ(CacheNamespace("t:acme", "team-a"), "t:acme/team-a");
  EXPECT_EQ(CacheNamespace("t:acme2", "x"), "t:acme2/x");
  EXPECT_NE(CacheNamespace("t:acme", "2/x"), CacheNamespace("t:acme2", "x"));
  EXPECT_NE(CacheNamespace("t:evil", "t:acme"), CacheNamespace("t:acme", ""));
  EXPECT_FALSE(TenantOwnsNamespace("t:acme", CacheNamespace("t:evil", "t:acme")));
  EXPECT_FALSE(TenantOwnsNamespace("t:acme", CacheNamespace("t:acme2", "")));
}

}  // namespace
}  // namespace chunkattn
