//go:build linux

package main

import "golang.org/x/sys/unix"

// The system calls the monitor stops, on arm64: the native ones and the
// 32-bit ARM ones, so that no calling convention goes unseen.
const (
	nativeArch = unix.AUDIT_ARCH_AARCH64
	compatArch = unix.AUDIT_ARCH_ARM
)

var monitorCalls = []monitorCall{
	{nativeArch, unix.SYS_EXECVE, callExec, 8, nil},
	{nativeArch, unix.SYS_EXECVEAT, callExecAt, 8, nil},
	{nativeArch, unix.SYS_CONNECT, callConnect, 8, nil},
	{nativeArch, unix.SYS_EXIT_GROUP, callExit, 8, nil},
	{compatArch, 11, callExec, 4, nil},
	{compatArch, 387, callExecAt, 4, nil},
	{compatArch, 283, callConnect, 4, nil},
	{compatArch, 248, callExit, 4, nil},
}

func init() {
	// The file calls: arm64 has only the *at forms (and truncate);
	// 32-bit ARM the older ones too.
	addFileCalls(nativeArch, 8, 0, []fileNr{
		{unix.SYS_OPENAT, fOpenat}, {unix.SYS_OPENAT2, fOpenat2}, {unix.SYS_MKDIRAT, fMkdirat},
		{unix.SYS_MKNODAT, fMknodat}, {unix.SYS_LINKAT, fLinkat}, {unix.SYS_SYMLINKAT, fSymlinkat},
		{unix.SYS_UNLINKAT, fUnlinkat}, {unix.SYS_RENAMEAT, fRenameat}, {unix.SYS_RENAMEAT2, fRenameat},
		{unix.SYS_TRUNCATE, fTruncate},
	})
	addFileCalls(compatArch, 4, 0, []fileNr{
		{5, fOpen}, {8, fCreat}, {322, fOpenat}, {437, fOpenat2}, {39, fMkdir}, {323, fMkdirat},
		{14, fMknod}, {324, fMknodat}, {9, fLink}, {330, fLinkat}, {83, fSymlink}, {331, fSymlinkat},
		{10, fUnlink}, {328, fUnlinkat}, {40, fUnlink}, {38, fRename}, {329, fRenameat}, {382, fRenameat},
		{92, fTruncate}, {193, fTruncate},
	})
}
