// The heap's settings (comm/heap.hpp): GLIBC_TUNABLES read as glibc reads it, and
// keep_freed_memory leaving alone only the thresholds a user set. What the settings do to
// the heap is heap_program's to check.

#include <xshard/comm/heap.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace {

using xshard::detail::tunable_value;

// glibc's malloc takes mallopt's settings; AddressSanitizer's allocator refuses them.
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
constexpr bool glibc_malloc = true;
#else
constexpr bool glibc_malloc = false;
#endif
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
constexpr bool glibc_reads_hugetlb = true;
#else
constexpr bool glibc_reads_hugetlb = false;
#endif

TEST(heap, tunables_are_read_as_glibc_reads_them) {
    EXPECT_EQ(tunable_value("glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb"), "1");
    EXPECT_EQ(tunable_value("glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=2",
                            "glibc.malloc.hugetlb"),
              "2");
    // The last setting counts; a name is whole, not a prefix.
    EXPECT_EQ(tunable_value("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0",
                            "glibc.malloc.hugetlb"),
              "0");
    EXPECT_EQ(tunable_value("glibc.malloc.hugetlbx=1", "glibc.malloc.hugetlb"), std::nullopt);
    EXPECT_EQ(tunable_value("glibc.malloc.hugetlb", "glibc.malloc.hugetlb"), std::nullopt);
    EXPECT_EQ(tunable_value("", "glibc.malloc.hugetlb"), std::nullopt);
    EXPECT_EQ(tunable_value("glibc.malloc.mmap_threshold=", "glibc.malloc.mmap_threshold"), "");
}

/// Sets (or, for a null value, unsets) an environment variable for its lifetime.
class scoped_env {
public:
    scoped_env(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name))
            old_ = old;
        value ? setenv(name, value, 1) : unsetenv(name);
    }
    ~scoped_env() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

TEST(heap, keep_freed_memory_leaves_alone_only_the_thresholds_a_user_set) {
    // Each call sets what xshard::environment set already: the process's heap is unchanged.
    const scoped_env on("XSHARD_KEEP_FREED_MEMORY", nullptr);
    const scoped_env mmap("MALLOC_MMAP_THRESHOLD_", nullptr);
    const scoped_env trim("MALLOC_TRIM_THRESHOLD_", nullptr);
    {
        const scoped_env t("GLIBC_TUNABLES", nullptr);
        EXPECT_EQ(xshard::keep_freed_memory(), glibc_malloc);
    }
    {
        const scoped_env t("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");
        EXPECT_EQ(xshard::keep_freed_memory(), glibc_malloc); // huge pages combine with it
        if (glibc_reads_hugetlb) {
            EXPECT_TRUE(xshard::heap_on_huge_pages());
        }
    }
    for (const char* user : {"glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1048576",
                             "glibc.malloc.trim_threshold=0"}) {
        const scoped_env t("GLIBC_TUNABLES", user);
        EXPECT_FALSE(xshard::keep_freed_memory()) << user;
    }
    {
        const scoped_env t("GLIBC_TUNABLES", nullptr);
        const scoped_env user("MALLOC_TRIM_THRESHOLD_", "0");
        EXPECT_FALSE(xshard::keep_freed_memory());
    }
    {
        const scoped_env t("GLIBC_TUNABLES", nullptr);
        const scoped_env off("XSHARD_KEEP_FREED_MEMORY", "0");
        EXPECT_FALSE(xshard::keep_freed_memory());
    }
}

} // namespace
