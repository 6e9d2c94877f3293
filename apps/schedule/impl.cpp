// Which library this dtp-schedule binary is linked with: the one part of
// schedule.cpp's program that differs between bin/dtp-schedule (the
// puzzles) and bin/dtp-schedule-reference, so schedule.cpp is compiled once.
#ifndef DTP_SCHEDULE_IMPL
#error "DTP_SCHEDULE_IMPL (puzzles or reference) is set by apps/CMakeLists.txt"
#endif

namespace dtp::schedule_app {

const char* this_impl() { return DTP_SCHEDULE_IMPL; }

}  // namespace dtp::schedule_app
