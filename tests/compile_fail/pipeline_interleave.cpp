#include <xshard/pipeline/schedule.hpp>
// Must not compile: the interleaved schedule needs m to be a multiple of p.
constexpr auto table =
    xshard::pipeline::make_schedule({xshard::pipeline::schedule_kind::interleaved, 4, 6, 2});
static_assert(table.ranks.size() == 4);
