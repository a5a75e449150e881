#!/bin/bash
# POSIX ACL workload for tests/posix.rs: run in directory $1 (a nodup mount, and tmpfs as the
# reference), as root, and print the ACLs, modes and owners it leaves plus what 'nobody' may do.
set -u
cd "$1"
umask 022
touch f; setfacl -m u:nobody:rw f
touch g; chmod 600 g; setfacl -m u:nobody:r g; chmod 640 g
touch h; setfacl -m u:nobody:rwx h; setfacl -m m::r h; setfacl -m g::--- h
touch i; setfacl -m u::r,g::r,o::- i
touch j; setfacl -m u:nobody:r j; setfacl -b j
touch m; setfacl -m m::rwx m
touch m2; chmod 664 m2; setfacl -m m::r-- m2
mkdir d; setfacl -d -m u:nobody:rwx d; setfacl -d -m g::r-x d
touch d/x; mkdir d/sub; touch d/sub/y; mknod d/fifo p; ln -s x d/link
mkdir s; chgrp nogroup s; chmod 2775 s; setfacl -d -m g:nogroup:rwx s
mkdir s/t; touch s/t/u
# permissions enforced
echo secret > p; chmod 600 p; setfacl -m u:nobody:r p
echo -n "nobody reads p: "; setpriv --reuid=65534 --regid=65534 --clear-groups cat p 2>&1
echo -n "nobody writes p: "; setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo x >> p' 2>&1 && echo ok
echo -n "nobody reads g: "; setpriv --reuid=65534 --regid=65534 --clear-groups cat g >/dev/null 2>&1 && echo ok || echo denied
# set-gid killed by unprivileged ACL change
touch k; chown nobody k; chmod 2770 k
setpriv --reuid=65534 --regid=65534 --clear-groups setfacl -m u:nobody:rw k
find . | sort | xargs -d '\n' getfacl -p 2>/dev/null
find . -printf '%p %M %u %g\n' | sort
