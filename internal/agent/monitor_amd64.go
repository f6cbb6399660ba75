//go:build linux

package main

import "golang.org/x/sys/unix"

// The system calls the monitor stops, on amd64: the native ones, the x32
// ones (the same architecture, numbers with bit 30 set) and the i386 ones
// (int 0x80), so that no calling convention goes unseen.
const (
	nativeArch = unix.AUDIT_ARCH_X86_64
	compatArch = unix.AUDIT_ARCH_I386
	x32Bit     = 0x40000000
)

var monitorCalls = []monitorCall{
	{nativeArch, unix.SYS_EXECVE, callExec, 8, nil},
	{nativeArch, unix.SYS_EXECVEAT, callExecAt, 8, nil},
	{nativeArch, unix.SYS_CONNECT, callConnect, 8, nil},
	{nativeArch, unix.SYS_EXIT_GROUP, callExit, 8, nil},
	{nativeArch, x32Bit | 520, callExec, 4, nil},
	{nativeArch, x32Bit | 545, callExecAt, 4, nil},
	{nativeArch, x32Bit | 42, callConnect, 4, nil},
	{nativeArch, x32Bit | 231, callExit, 4, nil},
	{compatArch, 11, callExec, 4, nil},
	{compatArch, 358, callExecAt, 4, nil},
	{compatArch, 362, callConnect, 4, nil},
	{compatArch, 102, callSocketcall, 4, nil},
	{compatArch, 252, callExit, 4, nil},
}

func init() {
	// The file calls: native and x32 share their numbers (x32's with
	// x32Bit set); i386 has its own.
	native := []fileNr{
		{2, fOpen}, {85, fCreat}, {257, fOpenat}, {437, fOpenat2}, {83, fMkdir}, {258, fMkdirat},
		{133, fMknod}, {259, fMknodat}, {86, fLink}, {265, fLinkat}, {88, fSymlink}, {266, fSymlinkat},
		{87, fUnlink}, {263, fUnlinkat}, {84, fUnlink}, {82, fRename}, {264, fRenameat}, {316, fRenameat},
		{76, fTruncate},
	}
	addFileCalls(nativeArch, 8, 0, native)
	addFileCalls(nativeArch, 4, x32Bit, native)
	addFileCalls(compatArch, 4, 0, []fileNr{
		{5, fOpen}, {8, fCreat}, {295, fOpenat}, {437, fOpenat2}, {39, fMkdir}, {296, fMkdirat},
		{14, fMknod}, {297, fMknodat}, {9, fLink}, {303, fLinkat}, {83, fSymlink}, {304, fSymlinkat},
		{10, fUnlink}, {301, fUnlinkat}, {40, fUnlink}, {38, fRename}, {302, fRenameat}, {353, fRenameat},
		{92, fTruncate}, {193, fTruncate},
	})
}
